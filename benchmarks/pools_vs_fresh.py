"""Warm worker pools against fresh deployments, measured in one run: the whole selection per
mode and -n, its wall and CPU time, CPU-seconds a case, and how long cases waited for their
workers (the `ready_s` phase: pool start, or a replacement when no spare was ready).

    python benchmarks/pools_vs_fresh.py [--workers 1 4] [--backend mocker] [--device DEVICE]
        [--spares 0 1] [-- PYTEST ARGS]

Modes: `fresh` (--handoff-fresh), and `pool+N` for each N of --spares. The ratio column is
each mode's best wall against fresh's best wall.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path

import psutil
from selection_run import run_selection


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--backend", default="mocker")
    parser.add_argument("--device", help="the backend's device, e.g. cpu for vllm")
    parser.add_argument("--spares", type=int, nargs="+", default=[0, 1])
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = parser.parse_args()
    common = ["--handoff-backend", args.backend, *args.pytest_args]
    if args.device:
        common += ["--handoff-device", args.device]
    modes = {"fresh": ["--handoff-fresh"]}
    modes |= {f"pool+{n}": ["--handoff-spare-workers", str(n)] for n in args.spares}
    print(
        f"{platform.node()} {platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {args.backend} {' '.join(args.pytest_args)}"
    )
    best: dict[str, float] = {}
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.workers:
            for mode, flags in modes.items():
                run = run_selection(Path(tmp) / f"{mode}-n{n}.xml", n, *common, *flags)
                cases = len(run.cases)
                bad = sum(1 for c in run.cases.values() if not c.passed)
                failures += bad
                waited = sum(c.phases.get("ready_s", 0.0) for c in run.cases.values())
                best[mode] = min(best.get(mode, run.wall_s), run.wall_s)
                print(
                    f"-n {n} {mode:>7}: {cases - bad}/{cases} passed, wall {run.wall_s:6.1f} s, "
                    f"CPU {run.cpu_s:6.1f} s ({run.cpu_s / max(cases, 1):.2f} a case), "
                    f"waiting for workers {waited:6.1f} s in all, "
                    f"peak RSS {run.peak_rss_mib:6.0f} MiB",
                    flush=True,
                )
                for line in run.failures:
                    print(f"    {line}")
    print()
    for mode, wall in best.items():
        print(f"best wall {mode:>7}: {wall:6.1f} s, {wall / best['fresh']:.2f}x of fresh")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
