"""The price of a worker loss under load, from the histories of load cases already run: per
case, how long the streams the fault cut paused before their next token (p50/p99 over every
run given), how the streams on surviving workers were disturbed (their largest gap between
tokens before the fault and after it), what the frontend counted, and how the faulted
worker's requests stood when the fault landed.

    python benchmarks/load_price.py RUN_DIR [RUN_DIR ...]

A RUN_DIR is a run folder (`--handoff-logs`, or .handoff/runs/<run>); every `load/*` case
folder under it counts, passed or failed.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from handoff.history import percentile


def events(history: Path) -> dict[str, dict]:
    """The first event of each name in a case's history.json."""
    seen: dict[str, dict] = {}
    for event in json.loads(history.read_text()):
        seen.setdefault(event["event"], event)
    return seen


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{percentile(values, 50):.0f} / {percentile(values, 99):.0f} (n={len(values)})"


def main(run_dirs: list[str]) -> int:
    cases: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for history in sorted(h for d in run_dirs for h in Path(d).rglob("load/*/history.json")):
        seen = events(history)
        if "load_accounted" not in seen:
            continue  # ended before its accounting: its failure says why
        case = cases[history.parent.name]
        case["passed"].append(seen.get("verdict", {}).get("passed", False))
        case["counts"].append(json.dumps(seen["metrics_read"]["counts"], sort_keys=True))
        victim = seen["fault_sent"]["worker"]
        placed = [r for r in seen["requests_placed"]["requests"] if r["worker"] == victim]
        case["victim"].append(", ".join(sorted(r["state"] for r in placed)))
        for row in seen["load_accounted"]["requests"]:
            if not row["stream"]:
                continue
            if row["cut"] and not row["failed"] and row.get("fault_to_next_token_ms") is not None:
                case["pause"].append(row["fault_to_next_token_ms"])
            elif not row["cut"]:
                for when in ("before", "after"):
                    if (gap := row.get(f"largest_gap_{when}_ms")) is not None:
                        case[when].append(gap)
    if not cases:
        print("no load case with its accounting under " + ", ".join(run_dirs))
        return 1
    for key, case in sorted(cases.items()):
        print(f"load/{key}: {sum(case['passed'])} of {len(case['passed'])} passed")
        print(f"  moved streams, fault to next token ms, p50 / p99: {spread(case['pause'])}")
        print(f"  surviving streams, largest gap before the fault: {spread(case['before'])}")
        print(f"  surviving streams, largest gap after the fault:  {spread(case['after'])}")
        for counts, n in Counter(case["counts"]).most_common():
            print(f"  counted {counts}: {n}")
        for states, n in Counter(case["victim"]).most_common():
            print(f"  the faulted worker held [{states}]: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
