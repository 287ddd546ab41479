"""Waiting for a condition against a monotonic deadline, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from handoff.errors import CaseFailure

T = TypeVar("T")

POLL_INTERVAL_S = 0.05
#: The signals that interrupted this process (the pytest plugin's handler adds them). Python
#: swallows a KeyboardInterrupt raised inside a finalizer ("Exception ignored in"): a run must
#: stop all the same, and a case stop at its next wait (`interruptible`).
INTERRUPTS: list[str] = []
#: How many of INTERRUPTS the waits inside `interruptible` have seen; None outside it.
_seen: list[int | None] = [None]


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside, a wait raises KeyboardInterrupt once for a signal that came since it began, in
    case the one the handler raised was swallowed; outside (a teardown), waits go on."""
    _seen[0] = len(INTERRUPTS)
    try:
        yield
    finally:
        _seen[0] = None


def _raise_if_interrupted() -> None:
    if _seen[0] is not None and len(INTERRUPTS) > _seen[0]:
        _seen[0] = len(INTERRUPTS)
        raise KeyboardInterrupt(f"signal {INTERRUPTS[-1]}, swallowed where it arrived")


class Timeout(CaseFailure):
    """A condition did not hold in time; the message says what was awaited and what was seen."""


class Deadline:
    """A point on the monotonic clock; `remaining()` never goes below zero."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def within(self, seconds: float) -> Deadline:
        """The earlier of this deadline and `seconds` from now."""
        inner = Deadline(seconds)
        inner.at = min(inner.at, self.at)
        return inner


def poll_until(
    probe: Callable[[], tuple[T | None, object]],
    deadline: Deadline,
    awaited: str,
) -> T:
    """Call `probe` until it returns a result that is not None; raise Timeout at the deadline.

    `probe` returns (result, seen): `seen` describes the latest observation for the error.
    """
    while True:
        _raise_if_interrupted()
        result, seen = probe()
        if result is not None:
            return result
        if deadline.expired():
            raise Timeout(f"timed out waiting for {awaited}; last seen: {seen}")
        time.sleep(min(POLL_INTERVAL_S, deadline.remaining()))  # poll interval
