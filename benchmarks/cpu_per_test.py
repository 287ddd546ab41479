"""A pytest plugin for benchmarks/suite_cpu.py: each test's CPU time (its process's own, and
that of the children it reaped) and wall time, one JSON line per test in the folder named by
HANDOFF_CPU_PER_TEST, a file per process (xdist workers included)."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

FOLDER_ENV = "HANDOFF_CPU_PER_TEST"


def cpu_s() -> tuple[float, float]:
    """CPU seconds of this process, and of the children it has reaped."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    own, reaped = cpu_s()
    started = time.monotonic()
    yield
    own_after, reaped_after = cpu_s()
    line = {
        "test": item.nodeid,
        "own_s": round(own_after - own, 3),
        "children_s": round(reaped_after - reaped, 3),
        "wall_s": round(time.monotonic() - started, 3),
        "started": round(started, 3),  # monotonic: one clock for every process of the machine
        "pid": os.getpid(),
    }
    out = Path(os.environ[FOLDER_ENV]) / f"{os.getpid()}.jsonl"
    with out.open("a") as file:
        file.write(json.dumps(line) + "\n")
