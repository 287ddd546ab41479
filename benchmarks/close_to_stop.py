"""How long after a client hangs up each worker that held its request stops it, from the
histories of abandoned cases already run: per backend and lifecycle, the seconds from the close
(from the stopped worker's resume, for `close_in_stall`) to the first reading of its in-flight
gauge at 0, p50/p99/max over every run given, and what the last worker to hold it logged of
its end (the cancellation taken, or the stream found gone), by how often.

    python benchmarks/close_to_stop.py RUN_DIR [RUN_DIR ...]

A RUN_DIR is a run folder (`--handoff-logs`, or .handoff/runs/<run>) with a results.json; every
`abandoned/*` case folder under it counts, passed or failed.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from handoff.history import percentile


def main(run_dirs: list[str]) -> int:
    stops: dict[tuple[str, str], list[float]] = defaultdict(list)
    logged: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for run_dir in map(Path, run_dirs):
        backend = json.loads((run_dir / "results.json").read_text())["backend"]
        for history in sorted(run_dir.glob("abandoned/*/history.json")):
            lifecycle = history.parent.name.split("-")[0]
            for event in json.loads(history.read_text()):
                if event["event"] == "request_stopped":
                    stops[(backend, lifecycle)].append(event["seconds"])
                elif event["event"] == "request_ended":
                    logged[(backend, lifecycle)][" + ".join(event["logged"]) or "nothing"] += 1
    if not stops:
        print("no abandoned case with a stopped request under the runs given")
        return 1
    print(f"{'backend':8} {'lifecycle':18} {'stops':>5} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
    for (backend, lifecycle), seconds in sorted(stops.items()):
        p50, p99 = percentile(seconds, 50), percentile(seconds, 99)
        print(
            f"{backend:8} {lifecycle:18} {len(seconds):5} {p50:7.3f} {p99:7.3f} {max(seconds):7.3f}"
            f"   logged: {dict(logged[(backend, lifecycle)])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
