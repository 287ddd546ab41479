"""Whether the machine's wall clock held against its monotonic clock while a deployment ran.

Dynamo's file store expires a discovery entry by its file's time on the wall clock, so a step
of the wall clock (a paused VM whose clock is set on resume, a clock set by hand, an NTP step)
expires every worker's lease at once, faulted or not; and handoff places a worker's log lines
(wall-clock stamps, to the microsecond) on its monotonic clock by their offset, which a step
moves. handoff judges by the monotonic clock, which a step does not move, so without this watch
such a case fails, or passes, on evidence the step bent.

There is no threshold to tune: on Linux, NTP's and chrony's slewing and frequency corrections
move CLOCK_MONOTONIC with CLOCK_REALTIME, and only a step changes the offset between them. So
any change of the offset that its readings can tell is a step. Each reading brackets the wall
clock between two reads of the monotonic clock: the spread of those two (a preemption between
them widens it) and the clocks' own resolution are what the reading cannot tell, measured
every time."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Offset:
    """The wall clock minus the monotonic clock, in nanoseconds: somewhere in [low, high]."""

    low: int
    high: int

    @property
    def middle(self) -> float:
        return (self.low + self.high) / 2


def read_offset() -> Offset:
    """One reading of the offset, bracketed by the monotonic clock read before and after."""
    before = time.monotonic_ns()
    wall = time.time_ns()
    after = time.monotonic_ns()
    return Offset(wall - after, wall - before)


def resolution_ns() -> int:
    """What the two clocks' readings cannot tell apart, as the system states it."""
    seconds = sum(time.get_clock_info(name).resolution for name in ("time", "monotonic"))
    return max(1, round(seconds * 1e9))


def step_between(start: Offset, end: Offset, resolution: int) -> float | None:
    """How far (seconds) the offset moved from `start` to `end`, where the two readings'
    brackets, widened by the clocks' `resolution`, cannot both hold one offset; else None."""
    if end.low - start.high > resolution or start.low - end.high > resolution:
        return (end.middle - start.middle) / 1e9
    return None


class WallClock:
    """The wall clock's offset from the monotonic clock, from when the watch began."""

    def __init__(self) -> None:
        self.offset = read_offset()

    def stepped(self) -> float | None:
        """How far the wall clock moved against the monotonic clock since the watch began or
        was last read, in seconds, where its readings prove a move (`step_between`); else
        None. The watch begins again."""
        offset = read_offset()
        step, self.offset = step_between(self.offset, offset, resolution_ns()), offset
        return None if step is None else round(step, 6)


def step_reason(step_s: float) -> str:
    """What a step means for the case that saw it."""
    size = f"{step_s:+.1f} s" if abs(step_s) >= 0.1 else f"{step_s * 1e3:+.3g} ms"
    return (
        f"the machine's wall clock stepped {size} against its monotonic clock while "
        "this deployment ran (a paused VM, a clock set, an NTP step): Dynamo's file store "
        "expires discovery leases on the wall clock, so every worker's lease may have run out "
        "at once, and workers' log stamps no longer place their lines on handoff's clock; this "
        "judged the machine, not the fault (docs/known-issues.md)"
    )
