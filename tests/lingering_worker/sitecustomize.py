"""Loaded by a worker whose PYTHONPATH holds this folder, with `HANDOFF_LINGER_S` set: a thread
that is not a daemon waits that long from the worker's start, so the worker's process outlives
its own shutdown by as much (Python waits for such threads before it exits): a worker that
does not end when it should."""

import os
import threading

if linger := os.environ.get("HANDOFF_LINGER_S"):
    threading.Thread(target=threading.Event().wait, args=(float(linger),), daemon=False).start()
