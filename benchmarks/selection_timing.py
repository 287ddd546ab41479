"""Wall time and memory of the whole pre-merge selection at several -n, and per case the time
from launch to ready, the request, fault to completed response, and the total.

    python benchmarks/selection_timing.py [--workers 1 2 4 8] [--selection pre_merge]
        [--backend mocker] [--device DEVICE]

A case's floor is its ready time plus its request's own time, measured in the same run; the
ratio column is total / floor (the harness's overhead: proofs, counters, teardown).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

import psutil
from selection_run import run_selection


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--selection", default="pre_merge")
    parser.add_argument("--backend", default="mocker")
    parser.add_argument("--device", help="the backend's device, e.g. cpu for vllm")
    args = parser.parse_args()
    device = ["--handoff-device", args.device] if args.device else []
    print(
        f"{platform.node()} {platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {args.backend} {args.selection}"
    )
    failures = 0
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.workers:
            run = run_selection(
                Path(tmp) / f"n{n}.xml", n,
                "--handoff-backend", args.backend, "--handoff-selection", args.selection, *device,
            )  # fmt: skip
            runs[n] = run
            bad = [k for k, c in run.cases.items() if not c.passed]
            failures += len(bad)
            worst = max((ratio(c.phases) for c in run.cases.values()), default=0.0)
            print(
                f"-n {n}: {len(run.cases) - len(bad)}/{len(run.cases)} passed, "
                f"wall {run.wall_s:5.1f} s, CPU {run.cpu_s:5.1f} s, "
                f"CPUs a case {run.cpu_s / run.wall_s / n:.2f}, "
                f"peak RSS {run.peak_rss_mib:6.0f} MiB, "
                f"worst total/floor {worst:.2f}",
                flush=True,
            )
            for line in run.failures:
                print(f"    {line}")
    best = min(runs, key=lambda n: runs[n].wall_s)
    print(f"\nper case at the best -n ({best}):")
    print(f"{'case':<70} {'ready':>6} {'request':>8} {'fault>end':>9} {'total':>6} {'ratio':>6}")
    for key, case in sorted(runs[best].cases.items()):
        p = case.phases
        print(
            f"{key:<70} {p.get('ready_s', 0):6.2f} {p.get('request_s', 0):8.2f} "
            f"{p.get('fault_to_end_s', 0):9.2f} {p.get('total_s', 0):6.2f} "
            f"{ratio(p):6.2f}"
        )
    return 1 if failures else 0


def ratio(phases: dict[str, float]) -> float:
    floor = phases.get("ready_s", 0) + phases.get("request_s", 0)
    return phases.get("total_s", 0) / floor if floor else 0.0


if __name__ == "__main__":
    sys.exit(main())
