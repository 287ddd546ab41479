"""At most two deployments a CPU slot start at once on this machine.

A deployment's start is mostly CPU (a pool's warm interpreter imports Dynamo once,
`handoff.machine.preload`, and the frontend and each worker set up their runtime), while the
rest of a case mostly waits, which is why cases run many at once. Forked starts wait for
discovery too, so two a CPU keep the main job faster than one (benchmarks/RESULTS.md). When a
dozen start together, the cases already in their fault window lose their CPU for seconds:
long enough for a short response to end before its fault lands, or for the client to fall
behind the stream. A start takes a slot first: an exclusive flock on one of N files
(`start-<n>.slot`, apart from the ports' `<port>.lock`) in the folder every run on the machine
shares (`ports.lease_dir`), which the kernel drops when its holder ends, however it ends, so
a killed run leaves no slot held. The wait comes out of the case's deadline. Not gated: the
workers a case starts mid-case (a joiner, a rolling replacement: part of its fault) and a
pool's spares, started in the background; slots are not handed out in the order asked.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from handoff.machine.cpus import cpu_slots
from handoff.machine.polling import Deadline, poll_until
from handoff.machine.ports import lease_dir, try_lock

STARTS_PER_CPU = 2


def slots() -> int:
    """How many starts may run at once: STARTS_PER_CPU a CPU slot (HANDOFF_CPU_SLOTS, set on
    purpose, sets the cases that run at once, not the CPUs, and leaves starts ungated)."""
    found = cpu_slots()
    return 0 if found.chosen else STARTS_PER_CPU * found.count


def _take(count: int) -> tuple[int | None, str]:
    folder = lease_dir()
    for n in range(count):
        if (fd := try_lock(folder / f"start-{n}.slot")) is not None:
            return fd, ""
    return None, f"all {count} start slot(s) held by other cases' starts"


@contextmanager
def start_slot(deadline: Deadline, count: int | None = None) -> Iterator[float]:
    """Hold one of `count` (default `slots()`) start slots for the block; yields how long the
    wait for it took, in seconds. With no slots, nothing is gated."""
    count = slots() if count is None else count
    if count <= 0:
        yield 0.0
        return
    began = time.monotonic()
    fd = poll_until(lambda: _take(count), deadline, "a start slot on this machine")
    try:
        yield time.monotonic() - began
    finally:
        os.close(fd)
