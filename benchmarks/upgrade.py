"""How far `nox -s upgrade -- FROM TO` runs from its floor: the two main jobs side by side, then
their diff. The floor is floor.py's, over the two selections together: the longer of the
longest case alone and the CPU-seconds of the whole session over the cores.

    python benchmarks/upgrade.py FROM TO [--runs 1]

The releases' virtualenvs are made by the session's first run (not timed here: run the
session once before). Run it on a machine otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import psutil
from floor import alone_s, busy_s

ROOT = Path(__file__).resolve().parents[1]


def newest_results(release: str) -> dict:
    """The results of `release`'s run in the session's newest folder (`.handoff/upgrade/STAMP`)."""
    session = max((ROOT / ".handoff" / "upgrade").iterdir(), key=lambda p: p.name)
    (run,) = (session / release).iterdir()
    return json.loads((run / "results.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("releases", nargs=2, metavar="RELEASE")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    cores = psutil.cpu_count()
    recorded = alone_s("mocker")
    print(f"{platform.node()}, {cores} CPUs, nox -s upgrade -- {' '.join(args.releases)}")
    heads = ("run", "cases", "failed", "wall s", "CPU s", "floor s", "ratio")
    print(" ".join(f"{h:>{w}}" for h, w in zip(heads, (3, 6, 6, 7, 7, 7, 6), strict=True)))
    status = 0
    for n in range(1, args.runs + 1):
        before, started = busy_s(), time.monotonic()
        done = subprocess.run(["nox", "-R", "-s", "upgrade", "--", *args.releases], cwd=ROOT)
        wall, cpu = time.monotonic() - started, busy_s() - before
        cases = [c for release in args.releases for c in newest_results(release)["cases"]]
        longest = max((recorded.get(c["key"], c["seconds"]) for c in cases), default=0.0)
        floor = max(longest, cpu / cores)
        failed = sum(1 for c in cases if not c["passed"] and not c["upstream_defect"])
        status |= done.returncode
        print(
            f"{n:>3} {len(cases):>6} {failed:>6} {wall:7.1f} {cpu:7.1f} {floor:7.1f} "
            f"{wall / floor:6.2f}",
            flush=True,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
