"""Loaded by a worker whose PYTHONPATH holds this folder, with `HANDOFF_REREGISTER_LOG` naming a
file: a worker that registers again after Dynamo ended it for a lost lease, as a fix of Dynamo
issue 3493 would have it. Before anything of the worker runs, a child is forked that waits for
the worker's end (the pipe's last writer gone); if the worker's log says its lease expired, the
child becomes the same worker again (its command line and environment, so its ports), under a
new lease and instance id, logging to that file; else it ends. Killed with the worker's tree."""

import os
import sys

if again_log := os.environ.pop("HANDOFF_REREGISTER_LOG", None):
    ended, alive = os.pipe()
    if os.fork() == 0:
        os.close(alive)
        os.read(ended, 1)  # b"": the worker has ended
        with open("/proc/self/fd/2", "rb") as log:  # the worker's log
            lost = b"Keep-alive lease expired" in log.read()
        if not lost:
            os._exit(0)
        again = os.open(again_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(again, 1)
        os.dup2(again, 2)
        os.execv(sys.executable, sys.orig_argv)
    os.close(ended)
