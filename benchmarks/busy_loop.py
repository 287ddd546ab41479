"""Run a command several times in a row while a busy loop takes a share of one core, as a
slower machine would: prints each run's wall time and exit status, and stops the loop after.

    python benchmarks/busy_loop.py --share 0.33 --runs 3 -- nox -s vllm_cpu_pre_merge
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time

#: The loop's period: short beside any bound a case computes, long beside the scheduler's tick.
PERIOD_S = 0.03


def spin(share: float) -> None:
    """Busy for `share` of each period, asleep for the rest."""
    while True:
        until = time.monotonic() + share * PERIOD_S
        while time.monotonic() < until:
            pass
        time.sleep((1 - share) * PERIOD_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--share", type=float, default=1 / 3, help="of one core, 0 to 1")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("command", nargs="+", help="after --")
    args = parser.parse_args()
    if not 0 < args.share < 1:
        parser.error(f"--share {args.share}: give a share of one core between 0 and 1")
    loop = multiprocessing.Process(target=spin, args=(args.share,), daemon=True)
    loop.start()
    failed = 0
    try:
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            code = subprocess.run(args.command).returncode
            failed += code != 0
            print(f"run {run}: exit {code}, {time.monotonic() - started:.1f} s", flush=True)
    finally:
        loop.terminate()
    print(f"{args.runs} runs, {failed} failed, busy loop at {args.share:.2f} of one core")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
