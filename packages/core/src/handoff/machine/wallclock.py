"""Whether the machine's wall clock held against its monotonic clock while a deployment ran.

Dynamo's file store expires a discovery entry by its file's time on the wall clock, so a step
of the wall clock (a paused VM whose clock is set on resume, a clock set by hand) expires every
worker's lease at once, faulted or not. handoff judges by the monotonic clock, which a step
does not move, so without this watch such a case fails with reasons that blame the fault."""

from __future__ import annotations

import time

#: A step larger than this is the machine's, not the slew of a clock kept in time: ntpd slews
#: at most 0.5 ms a second, and a chrony catching up 83 ms a second needs half a minute to move
#: this far. Well under the 10 s a worker's discovery lease lasts (docs/known-issues.md).
STEP_LIMIT_S = 2.0


class WallClock:
    """The wall clock's offset from the monotonic clock, from when the watch began."""

    def __init__(self) -> None:
        self.offset = time.time() - time.monotonic()

    def stepped(self) -> float | None:
        """How far the wall clock moved against the monotonic clock since the watch began or
        was last read, rounded, if past STEP_LIMIT_S; else None. The watch begins again."""
        offset = time.time() - time.monotonic()
        step, self.offset = offset - self.offset, offset
        return round(step, 1) if abs(step) > STEP_LIMIT_S else None


def step_reason(step_s: float) -> str:
    """What a step means for the case that saw it."""
    return (
        f"the machine's wall clock stepped {step_s:+.1f} s against its monotonic clock while "
        "this deployment ran (a paused VM, or a clock set): Dynamo's file store expires "
        "discovery leases on the wall clock, so every worker's lease may have run out at once; "
        "this judged the machine, not the fault (docs/known-issues.md)"
    )
