"""Loaded by a worker whose PYTHONPATH holds this folder, with `HANDOFF_HELD_UNTIL` naming a
FIFO: before anything of the worker runs, it waits until the test writes to that FIFO and
closes it. A replacement slower to start than a case's requests last, by construction: no
signal has to land before the worker registers."""

import os

if held_until := os.environ.get("HANDOFF_HELD_UNTIL"):
    with open(held_until) as fifo:
        fifo.read()
