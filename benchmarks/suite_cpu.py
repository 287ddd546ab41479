"""Where `nox -s tests` spends its CPU, and how fast this machine is, so that suite times from
different machines (or one machine on different days: the same 2-core kind has varied by a
third) can be compared.

    .nox/tests/bin/python benchmarks/suite_cpu.py [-- PYTEST ARGS]

Run from the repository root with the tests session's venv (`nox -s tests` makes it). Prints the
yardstick (the CPU seconds one process takes to generate every nightly selection with an empty
cache of generated arrays: a fixed, deterministic search), the suite's wall and CPU time (every
process it started and reaped), the CPU per yardstick, the test modules and the tests that used
most CPU, and the longest tests. The suite runs as `nox -s tests` runs it, unless PYTEST ARGS
replace its arguments.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from operator import itemgetter
from pathlib import Path

from cpu_per_test import FOLDER_ENV, cpu_s

from handoff.machine.environment import CACHE_ENV

SUITE = ["tests", "--ignore", "tests/vllm_cpu", "-n", "12"]
YARDSTICK = (
    "from handoff.cases import TOPOLOGIES, selection\nfor t in TOPOLOGIES: selection(t, 'nightly')"
)
SHOWN = 15


def reaped_cpu_s() -> float:
    return cpu_s()[1]


def yardstick_s() -> float:
    """The CPU seconds of generating every nightly selection in a fresh process."""
    with tempfile.TemporaryDirectory() as cache:
        before = reaped_cpu_s()
        subprocess.run(
            [sys.executable, "-c", YARDSTICK],
            env={**os.environ, CACHE_ENV: cache},
            check=True,
        )
        return reaped_cpu_s() - before


def main(argv: list[str]) -> int:
    chosen = argv[argv.index("--") + 1 :] if "--" in argv else SUITE
    benchmarks = str(Path(__file__).resolve().parent)
    with tempfile.TemporaryDirectory() as folder:
        env = {
            **os.environ,
            FOLDER_ENV: folder,
            "PYTHONPATH": os.pathsep.join(filter(None, [benchmarks, os.environ.get("PYTHONPATH")])),
            # As nox runs it: the venv's commands (handoff) first on PATH.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        }
        yardstick = yardstick_s()
        before, started = reaped_cpu_s(), time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "cpu_per_test", *chosen], env=env
        )
        wall, cpu = time.monotonic() - started, reaped_cpu_s() - before
        tests = [json.loads(line) for f in Path(folder).glob("*.jsonl") for line in f.open()]
    by_module: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for test in tests:
        totals = by_module[test["test"].split("::")[0]]
        totals[0] += test["own_s"] + test["children_s"]
        totals[1] += test["wall_s"]
        totals[2] += 1
    print(f"suite_cpu: exit {run.returncode}, {len(tests)} tests")
    print(f"yardstick (every nightly generated, one process): {yardstick:.2f} CPU-s")
    print(f"suite: wall {wall:.1f} s, CPU {cpu:.1f} s, {cpu / yardstick:.1f} yardsticks of CPU")
    print(f"{'module':<50} {'tests':>5} {'CPU s':>7} {'wall s':>7}")
    for module, (module_cpu, module_wall, count) in sorted(
        by_module.items(), key=lambda kv: -kv[1][0]
    )[:SHOWN]:
        print(f"{module:<50} {count:>5} {module_cpu:>7.1f} {module_wall:>7.1f}")
    print_costliest(tests)
    print_occupancy(tests, started, wall)
    return run.returncode


def print_costliest(tests: list[dict]) -> None:
    """The tests that used most CPU, the longest, and the sum of every test's wall time (what
    the xdist workers spent, waits included)."""
    own, reaped = (sum(t[k] for t in tests) for k in ("own_s", "children_s"))
    print(
        f"tests' wall time summed: {sum(t['wall_s'] for t in tests):.0f} s; CPU {own:.0f} s in "
        f"the pytest processes, {reaped:.0f} s in the children they reaped"
    )
    for title, key in (
        ("CPU", lambda t: t["own_s"] + t["children_s"]),
        ("wall", itemgetter("wall_s")),
    ):
        print(f"the most {title}:")
        for test in sorted(tests, key=key, reverse=True)[:SHOWN]:
            cpu = test["own_s"] + test["children_s"]
            print(f"  {cpu:6.1f} CPU-s {test['wall_s']:6.1f} s  {test['test']}")


def print_occupancy(tests: list[dict], started: float, wall: float) -> None:
    """How many pytest processes ran a test at once, second by second, what each ran in all
    (the busiest bounds the wall), and the tests of the tail (from the last second all of them
    were busy): where the suite waits on a few."""
    busy: list[set[int]] = [set() for _ in range(int(wall) + 1)]
    for test in tests:
        first = test["started"] - started
        for second in range(int(first), min(int(first + test["wall_s"]) + 1, len(busy))):
            busy[second].add(test["pid"])
    counts = collections.Counter(len(pids) for pids in busy)
    print(
        "seconds with N processes busy: " + ", ".join(f"{n}: {counts[n]}" for n in sorted(counts))
    )
    per_process = collections.Counter()
    for test in tests:
        per_process[test["pid"]] += test["wall_s"]
    print(
        "each process's tests, wall summed: "
        + ", ".join(f"{s:.0f}" for _, s in per_process.most_common())
    )
    most = max(counts, default=0)
    tail = max((s for s, pids in enumerate(busy) if len(pids) == most), default=0)
    print(f"the tail: fewer than {most} busy from second {tail + 1} of {len(busy)}; its tests:")
    for test in sorted(tests, key=lambda t: t["started"] + t["wall_s"])[-8:]:
        begun = test["started"] - started
        print(f"  {begun:6.1f} +{test['wall_s']:6.1f} s  {test['test']}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
