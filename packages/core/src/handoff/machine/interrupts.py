"""Ctrl-C and SIGTERM raised as KeyboardInterrupt, remembered, and not raised inside the
standard library's locking.

Python runs a signal handler right after a C call returns, so a KeyboardInterrupt can land in
`Condition.__enter__` after its lock was taken and before the `with` block that frees it: the
lock stays held, and the next acquire in the same thread waits forever (urllib3's `finally`,
putting its connection back into the pool's queue, hung an interrupted run that way; CPython
issue 29988). An interrupt that arrives there is raised a moment later, once the thread is out
of it; one still there after `DEFER_S` is blocked in a wait, where raising frees nothing it
holds, and is raised there. While one waits, SIGALRM is this module's.
"""

from __future__ import annotations

import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The signals that interrupted this process. Python swallows a KeyboardInterrupt raised inside
#: a finalizer ("Exception ignored in"): a run must stop all the same, and a case stop at its
#: next wait (`interruptible`).
INTERRUPTS: list[str] = []
#: The modules whose code takes a lock and then enters the block that frees it.
LOCKING_FILES = frozenset(module.__file__ for module in (threading, queue, logging))
#: How soon an interrupt that arrived inside them is tried again (a one-shot timer signal),
#: and for how long at most.
RETRY_S = 0.01
DEFER_S = 1.0
#: How many of INTERRUPTS have been raised.
_raised = [0]
#: How many of INTERRUPTS the waits inside `interruptible` have seen; None outside it.
_seen: list[int | None] = [None]
#: Since when an interrupt waits to be raised, and the SIGALRM handler it took over.
_deferred: dict[str, Any] = {}


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
        _stop_retrying()  # a wait raised it first
    elif _in_locking(frame) and _deferred_for() < DEFER_S:
        _retry_soon()
    else:
        _raise("")


def _in_locking(frame) -> bool:
    """Whether `frame`, or the frame a handler of this module was running over (a second
    signal during the first's handling), is in `LOCKING_FILES`."""
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename in LOCKING_FILES


def _deferred_for() -> float:
    return time.monotonic() - _deferred["since"] if _deferred else 0.0


def _retry_soon() -> None:
    if not _deferred:
        _deferred["since"] = time.monotonic()
        _deferred["alarm"] = signal.signal(signal.SIGALRM, _raise_outside_locking)
    signal.setitimer(signal.ITIMER_REAL, RETRY_S)


def _stop_retrying() -> None:
    if _deferred:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, _deferred["alarm"])
        _deferred.clear()


def _raise(how: str) -> None:
    _stop_retrying()
    _raised[0] = len(INTERRUPTS)
    raise KeyboardInterrupt(f"signal {INTERRUPTS[-1]}{how}")


def _unwinding() -> bool:
    """Whether a KeyboardInterrupt is on its way up already (a `finally` below it runs)."""
    return isinstance(sys.exc_info()[1], KeyboardInterrupt)


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside, a wait raises KeyboardInterrupt once for a signal that came since it began and
    was not raised yet, or was swallowed; outside (a teardown), waits go on. One still waiting
    to be raised when the block ends is raised there, so that the case, not its teardown,
    meets it."""
    _seen[0] = len(INTERRUPTS)
    try:
        yield
    finally:
        _seen[0] = None
        if _deferred and not _unwinding():
            _raise("")


def raise_if_interrupted() -> None:
    if _seen[0] is not None and len(INTERRUPTS) > _seen[0]:
        _seen[0] = len(INTERRUPTS)
        if not _unwinding():
            _raise("" if _raised[0] < len(INTERRUPTS) else ", swallowed where it arrived")
