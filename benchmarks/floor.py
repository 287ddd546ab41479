"""How far a selection runs from its floor: wall time, CPU-seconds, the longest case, the floor
and the ratio, in one table. The floor is the longer of the longest case alone (from the
durations recorded one case at a time, durations/<backend>.json, else this run's) and the
CPU-seconds over the cores: no schedule on this machine can beat either.

    python benchmarks/floor.py [--backend mocker] [--runs 1] [-- PYTEST ARGS]

Pytest is run as the nox session runs it, with no -n unless given after --. CPU-seconds are
the machine's busy time over the run (every core, user and system), so that a process that
outlives its parent (vLLM's engine core) counts too: run it on a machine otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import psutil
from selection_run import run_selection

from handoff.pytest_plugin import case_key

ROOT = Path(__file__).resolve().parents[1]


def busy_s() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def alone_s(backend: str) -> dict[str, float]:
    """Each case's duration when run one at a time, as recorded for the shards."""
    path = ROOT / "durations" / f"{backend}.json"
    if not path.exists():
        return {}
    return {case_key(k): s for k, s in json.loads(path.read_text()).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="mocker")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("pytest_args", nargs="*", help="after --, e.g. --handoff-topology load")
    args = parser.parse_args()
    cores = psutil.cpu_count()
    recorded = alone_s(args.backend)
    print(f"{platform.node()}, {cores} CPUs, {args.backend} {' '.join(args.pytest_args)}")
    print(
        f"{'run':>3} {'cases':>6} {'failed':>6} {'wall s':>7} {'CPU s':>7} {'longest s':>9} "
        f"{'floor s':>7} {'ratio':>6}"
    )
    failed_any = False
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(1, args.runs + 1):
            before = busy_s()
            run = run_selection(
                Path(tmp) / f"run-{n}.xml", 1, "--handoff-backend", args.backend, *args.pytest_args
            )
            cpu = busy_s() - before
            durations = {
                k: recorded.get(k, c.phases.get("total_s", 0.0)) for k, c in run.cases.items()
            }
            longest = max(durations.values(), default=0.0)
            floor = max(longest, cpu / cores)
            failed = [k for k, c in run.cases.items() if not c.passed]
            failed_any |= bool(failed) or run.returncode != 0
            print(
                f"{n:>3} {len(run.cases):>6} {len(failed):>6} {run.wall_s:7.1f} {cpu:7.1f} "
                f"{longest:9.1f} {floor:7.1f} {run.wall_s / floor:6.2f}",
                flush=True,
            )
            for line in run.failures:
                print(f"    {line}")
    return 1 if failed_any else 0


if __name__ == "__main__":
    sys.exit(main())
