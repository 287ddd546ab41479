"""Run the main job N times in a row under the busy loop, as a slower machine would, and print
each case that did not pass or fail as its known defect: its outcome and its reasons. Nothing is
retried. Exits non-zero when any case failed or missed its window.

    python benchmarks/flake.py --runs 20 --share 0.5 [-- nox -R -s mocker_pre_merge ARGS]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from busy_loop import spin

DEFAULT_COMMAND = ["nox", "-R", "-s", "mocker_pre_merge"]
#: The line of a qualification run that names its results file.
RESULTS_LINE = re.compile(r"^results: (\S+results\.json)", re.MULTILINE)
#: How a case not proven because its fault came after its request names itself
#: (`handoff.windows.MISSED_WINDOW`).
MISSED = "missed window"


def run_once(command: list[str]) -> tuple[int, float, list[dict]]:
    """Exit code, wall seconds and the cases of one run, from the results file it names."""
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - started
    found = RESULTS_LINE.search(done.stdout)
    if found is None:
        tail = (done.stdout + done.stderr)[-2000:]
        raise SystemExit(f"the run named no results file (exit {done.returncode}):\n{tail}")
    cases = json.loads(Path(found.group(1)).read_text())["cases"]
    return done.returncode, wall, cases


def verdict_of(case: dict) -> str:
    """The case's outcome as `handoff.verdict.outcome_of` tells it, a missed window apart."""
    if case["passed"] and not case["unproven"]:
        return "passed"
    if case["reasons"] and not case["upstream_defect"]:
        return "failed"
    if case["unproven"]:
        missed = any(why.startswith(MISSED) for why in case["unproven"])
        return MISSED if missed else "not proven"
    return "xfail" if case["upstream_defect"] else "failed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--share", type=float, default=0.5, help="of one core, 0 to 1")
    parser.add_argument("command", nargs="*", help="after --; default: nox -R -s mocker_pre_merge")
    args = parser.parse_args()
    if not 0 <= args.share < 1:
        parser.error(f"--share {args.share}: give a share of one core from 0 to below 1")
    command = args.command or DEFAULT_COMMAND
    loop = None
    if args.share:
        loop = multiprocessing.Process(target=spin, args=(args.share,), daemon=True)
        loop.start()
    tally: Counter[str] = Counter()
    try:
        for run in range(1, args.runs + 1):
            code, wall, cases = run_once(command)
            seen = Counter(verdict_of(c) for c in cases)
            tally.update(seen)
            said = ", ".join(f"{n} {what}" for what, n in sorted(seen.items()))
            print(f"run {run}/{args.runs}: exit {code}, {wall:.1f} s: {said}", flush=True)
            for case in cases:
                if (outcome := verdict_of(case)) not in ("passed", "xfail"):
                    # A reason's first line: the frontend's log that may follow is in its folder.
                    why = "; ".join(r.splitlines()[0] for r in case["reasons"] + case["unproven"])
                    print(f"    {case['key']}: {outcome}: {why}", flush=True)
    finally:
        if loop is not None:
            loop.terminate()
    print(
        f"\n{platform.node()}, {args.runs} runs of {' '.join(command)}, busy loop at "
        f"{args.share:.2f} of one core: "
        + ", ".join(f"{n} {what}" for what, n in sorted(tally.items()))
    )
    return 1 if tally["failed"] or tally[MISSED] or tally["not proven"] else 0


if __name__ == "__main__":
    sys.exit(main())
