"""Run a handoff selection many times in a row and print passes, failures and wall times.

Each run is a fresh pytest process against the real Dynamo frontend and mocker workers.
Nothing is retried: a failed case counts as failed, and its kept logs are printed.

    python benchmarks/repeat_selection.py --runs 20 [--workers 2] [--selection pre_merge]
        [--topology load ...]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from selection_run import run_selection


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (-n)")
    parser.add_argument("--backend", default="mocker")
    parser.add_argument("--selection", default="pre_merge")
    parser.add_argument(
        "--topology", action="append", default=[], help="only these topologies (repeatable)"
    )
    args = parser.parse_args()
    topologies = [arg for t in args.topology for arg in ("--handoff-topology", t)]

    walls: list[float] = []
    per_case: dict[str, list[float]] = defaultdict(list)
    passes = failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            run = run_selection(
                Path(tmp) / f"run-{i}.xml", args.workers,
                "--handoff-backend", args.backend, "--handoff-selection", args.selection,
                *topologies,
            )  # fmt: skip
            walls.append(run.wall_s)
            ok = sum(1 for c in run.cases.values() if c.passed)
            passes += ok
            failures += len(run.cases) - ok
            for key, case in run.cases.items():
                per_case[key].append(case.phases.get("total_s", 0.0))
            print(
                f"run {i + 1:>3}/{args.runs}: {ok}/{len(run.cases)} passed in {run.wall_s:6.1f} s",
                flush=True,
            )
            for line in run.failures:
                print(f"    {line}")

    print(
        f"\n{platform.node()} {platform.machine()} Python {platform.python_version()}, "
        f"{args.backend} {args.selection} {' '.join(args.topology) or 'every topology'}, "
        f"-n {args.workers}, {args.runs} runs"
    )
    print(f"cases: {passes} passed, {failures} failed (no retries)")
    print(f"selection wall time: median {statistics.median(walls):.1f} s, max {max(walls):.1f} s")
    print(f"{'case':<72} {'median s':>9} {'max s':>7}")
    for key, times in sorted(per_case.items()):
        print(f"{key:<72} {statistics.median(times):>9.2f} {max(times):>7.2f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
