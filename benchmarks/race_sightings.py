"""Run a race case (cases.Topology.race) alone several times in a row and print, for
each run, the trial at which the race first showed and the verdict: the figures behind
RACE_TRIALS["worker_stall"]. Each run is a fresh pytest process with its own deployment; no retries.

    python benchmarks/race_sightings.py --runs 20 [--backend vllm] [--device cpu]
        [--case decode_race/worker_stall-chat-tcp]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import tempfile
from pathlib import Path

from selection_run import run_selection

from handoff.policies import RACE_TRIALS as TRIALS

RACE_TRIALS = TRIALS["worker_stall"]

SIGHTED = re.compile(r"trial (\d+) of (\d+) failed")


def first_sight(record: dict) -> str:
    """The trial that failed, "never" where every trial passed, or "-" where the run ended
    otherwise (a failure before the trials, not proven): no figure of the race's."""
    found = next((m for n in record["notes"] if (m := SIGHTED.fullmatch(n))), None)
    if found:
        return found[1]
    return "never" if f"{RACE_TRIALS} trials passed" in record["notes"] else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--backend", default="vllm")
    parser.add_argument("--device", default="cpu", help="the backend's device (vLLM's: cpu)")
    parser.add_argument("--case", default="decode_race/worker_stall-chat-tcp")
    args = parser.parse_args()
    sights: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(1, args.runs + 1):
            logs = Path(tmp) / f"run-{i}"
            run = run_selection(
                logs.with_suffix(".xml"), 1, "--handoff-backend", args.backend,
                "--handoff-device", args.device, "--handoff-case", args.case,
                "--handoff-logs", str(logs),
            )  # fmt: skip
            records = [
                c for r in logs.glob("*/results.json") for c in json.loads(r.read_text())["cases"]
            ]
            if len(records) != 1:
                print(f"run {i}: {len(records)} cases recorded, not 1: {run.failures or logs}")
                return 1
            (record,) = records
            sights.append(first_sight(record))
            outcome = record.get("upstream_defect") or "; ".join(record["reasons"])[:120]
            print(f"run {i:>2}: first sight at trial {sights[-1]}, {run.wall_s:.0f} s: {outcome}")
    seen = [int(s) for s in sights if s.isdigit()]
    judged = [s for s in sights if s != "-"]
    print(f"\n{platform.node()}, {args.backend} {args.case}, {args.runs} runs")
    print(f"trials to first sight: {', '.join(sights)}")
    if seen:
        trials = sum(seen) + RACE_TRIALS * (len(judged) - len(seen))
        print(
            f"seen in {len(seen)} of {len(judged)} runs that reached the trials; median "
            f"{statistics.median(seen)}, max {max(seen)}; {len(seen)} sightings in {trials} "
            f"trials, {len(seen) / trials:.3f} a trial, all {RACE_TRIALS} missed with a "
            f"probability of {(1 - len(seen) / trials) ** RACE_TRIALS:.2%}"
        )
    return 0 if len(seen) == len(sights) else 1


if __name__ == "__main__":
    sys.exit(main())
