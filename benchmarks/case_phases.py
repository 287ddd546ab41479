"""Per case of a run folder: launch to ready, the request, fault to completed response, and
the total, from its results.json; then the run's wall time.

    python benchmarks/case_phases.py .handoff/runs/RUN
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(run_dir: str) -> int:
    results = json.loads((Path(run_dir) / "results.json").read_text())
    print(f"{'case':<66} {'verdict':>7} {'ready':>6} {'request':>8} {'fault>end':>9} {'total':>6}")
    for case in sorted(results["cases"], key=lambda c: c["key"]):
        p = case["phases"]
        print(
            f"{case['key']:<66} {'PASS' if case['passed'] else 'FAIL':>7} "
            f"{p.get('ready_s', 0):6.1f} {p.get('request_s', 0):8.1f} "
            f"{p.get('fault_to_end_s', 0):9.1f} {p.get('total_s', 0):6.1f}"
        )
    print(f"{results['backend']} {results['selection']}: wall {results['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
