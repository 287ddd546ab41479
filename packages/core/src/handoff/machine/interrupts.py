"""Ctrl-C and SIGTERM raised as KeyboardInterrupt, remembered, and never raised inside the
standard library's locking.

Python runs a signal handler right after a C call returns, so a KeyboardInterrupt can land in
`Condition.__enter__` after its lock was taken and before the `with` block that frees it: the
lock stays held, and the next acquire in the same thread waits forever (urllib3's `finally`,
putting its connection back into the pool's queue, hung an interrupted run that way; CPython
issue 29988). An interrupt that arrives there is raised a moment later, outside it.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The signals that interrupted this process. Python swallows a KeyboardInterrupt raised inside
#: a finalizer ("Exception ignored in"): a run must stop all the same, and a case stop at its
#: next wait (`interruptible`).
INTERRUPTS: list[str] = []
#: The modules whose code takes a lock and then enters the block that frees it.
LOCKING_FILES = frozenset(module.__file__ for module in (threading, queue, logging))
#: How soon an interrupt that arrived inside them is tried again (a one-shot timer signal).
RETRY_S = 0.01
#: How many of INTERRUPTS have been raised.
_raised = [0]
#: How many of INTERRUPTS the waits inside `interruptible` have seen; None outside it.
_seen: list[int | None] = [None]


def remember() -> None:
    """SIGTERM unwinds like Ctrl-C, so every case's teardown runs, and both are remembered; a
    handler someone else installed is left alone."""
    for sig, default in (
        (signal.SIGINT, signal.default_int_handler),
        (signal.SIGTERM, signal.SIG_DFL),
    ):
        if signal.getsignal(sig) is default:
            signal.signal(sig, _interrupted)


def _interrupted(signum: int, frame: object) -> None:
    INTERRUPTS.append(signal.Signals(signum).name)
    _raise_outside_locking(signum, frame)


def _raise_outside_locking(signum: int, frame: object) -> None:
    if _raised[0] == len(INTERRUPTS):
        return  # a wait raised it first
    if getattr(getattr(frame, "f_code", None), "co_filename", None) in LOCKING_FILES:
        signal.signal(signal.SIGALRM, _raise_outside_locking)
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)
        return
    _raise("")


def _raise(how: str) -> None:
    _raised[0] = len(INTERRUPTS)
    raise KeyboardInterrupt(f"signal {INTERRUPTS[-1]}{how}")


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside, a wait raises KeyboardInterrupt once for a signal that came since it began and
    was not raised yet, or was swallowed; outside (a teardown), waits go on."""
    _seen[0] = len(INTERRUPTS)
    try:
        yield
    finally:
        _seen[0] = None


def raise_if_interrupted() -> None:
    if _seen[0] is not None and len(INTERRUPTS) > _seen[0]:
        _seen[0] = len(INTERRUPTS)
        _raise("" if _raised[0] < len(INTERRUPTS) else ", swallowed where it arrived")
