"""Run a handoff selection many times in a row and print passes, failures and wall times.

Each run is a fresh `pytest --pyargs handoff.qualification` process against the real Dynamo
frontend and mocker workers; per-case times come from its JUnit XML. Nothing is retried: a
failed case counts as failed, and its logs are kept (the path is printed).

    python benchmarks/repeat_selection.py --runs 20 [--workers 2] [--selection pre_merge]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def run_once(args: argparse.Namespace, junit: Path) -> tuple[float, dict[str, tuple[bool, float]]]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "handoff.qualification",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        "--handoff-backend",
        args.backend,
        "--handoff-selection",
        args.selection,
    ]
    if args.workers > 1:
        command += ["-n", str(args.workers)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - started
    cases = {}
    for testcase in ET.parse(junit).getroot().iter("testcase"):
        case_id = testcase.get("name", "").split("[", 1)[-1].rstrip("]")
        failed = any(testcase.find(tag) is not None for tag in ("failure", "error"))
        cases[case_id] = (not failed, float(testcase.get("time", 0)))
    if done.returncode != 0:
        kept = [line.strip() for line in done.stdout.splitlines() if "logs kept:" in line]
        print(f"  run failed (exit {done.returncode}); " + ("; ".join(kept) or done.stdout[-500:]))
    return wall, cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (-n)")
    parser.add_argument("--backend", default="mocker")
    parser.add_argument("--selection", default="pre_merge")
    args = parser.parse_args()

    walls: list[float] = []
    per_case: dict[str, list[float]] = defaultdict(list)
    passes = failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            wall, cases = run_once(args, Path(tmp) / f"run-{i}.xml")
            walls.append(wall)
            ok = sum(1 for passed, _ in cases.values() if passed)
            passes += ok
            failures += len(cases) - ok
            for case_id, (_, seconds) in cases.items():
                per_case[case_id].append(seconds)
            print(
                f"run {i + 1:>3}/{args.runs}: {ok}/{len(cases)} passed in {wall:6.1f} s", flush=True
            )

    print(
        f"\n{platform.node()} {platform.machine()} Python {platform.python_version()}, "
        f"{args.backend} {args.selection}, -n {args.workers}, {args.runs} runs"
    )
    print(f"cases: {passes} passed, {failures} failed (no retries)")
    print(f"selection wall time: median {statistics.median(walls):.1f} s, max {max(walls):.1f} s")
    print(f"{'case':<72} {'median s':>9} {'max s':>7}")
    for case_id, times in sorted(per_case.items()):
        print(f"{case_id:<72} {statistics.median(times):>9.2f} {max(times):>7.2f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
