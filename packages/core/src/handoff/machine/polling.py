"""Waiting for a condition against a monotonic deadline, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from handoff.errors import CaseFailure
from handoff.machine.interrupts import raise_if_interrupted

T = TypeVar("T")

POLL_INTERVAL_S = 0.05


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
        raise_if_interrupted()
        result, seen = probe()
        if result is not None:
            return result
        if deadline.expired():
            raise Timeout(f"timed out waiting for {awaited}; last seen: {seen}")
        time.sleep(min(POLL_INTERVAL_S, deadline.remaining()))  # poll interval
