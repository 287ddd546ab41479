"""Run a handoff selection once in a fresh pytest process and read back what happened.

Shared by the benchmark scripts here: wall time, CPU time, the peak resident memory of the
whole process tree (pytest, its xdist workers and every deployment), and per case the outcome
and the phase times the qualification test records (ready_s, request_s, fault_to_end_s,
total_s).
"""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from handoff.pytest_plugin import case_key

SAMPLE_S = 0.1


@dataclass
class CaseRun:
    passed: bool
    phases: dict[str, float] = field(default_factory=dict)


@dataclass
class SelectionRun:
    returncode: int
    wall_s: float
    #: CPU seconds (user + system) of pytest and everything it started, reaped or not.
    cpu_s: float
    peak_rss_mib: float
    cases: dict[str, CaseRun]
    failures: list[str]


def run_selection(junit: Path, workers: int = 1, *extra: str) -> SelectionRun:
    """`extra`: further pytest arguments, e.g. --handoff-selection nightly."""
    command = [
        sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification", "-q",
        "-p", "no:cacheprovider", f"--junitxml={junit}", *extra,
    ]  # fmt: skip
    if workers > 1:
        command += ["-n", str(workers)]
    log = junit.with_suffix(".log")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        peak = 0
        root = psutil.Process(process.pid)
        while process.poll() is None:
            peak = max(peak, _tree_rss(root))
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=SAMPLE_S)  # the sampling period, not a synchronisation
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    output = log.read_text()
    cases = {}
    for testcase in ET.parse(junit).getroot().iter("testcase"):
        key = case_key(testcase.get("name", ""))  # xdist's `@<group>` suffix dropped
        failed = any(testcase.find(tag) is not None for tag in ("failure", "error"))
        phases = {
            p.get("name"): float(p.get("value"))
            for p in testcase.iter("property")
            if p.get("name", "").endswith("_s")
        }
        cases[key] = CaseRun(not failed, phases)
    kept = [line.strip() for line in output.splitlines() if line.startswith("logs kept for ")]
    return SelectionRun(process.returncode, wall, cpu, peak / 2**20, cases, kept)


def _tree_rss(root: psutil.Process) -> int:
    total = 0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += proc.memory_info().rss
    return total
