"""How evenly pytest-split shares a selection among N shards, with the recorded durations and
without them (every case weighing the same), each shard summed in recorded seconds.

    python benchmarks/shard_balance.py [--durations durations/mocker.json] [--splits 4]
        [--selection nightly] [--backend mocker]

The split is pytest-split's own, as each CI runner computes it: the qualification suite is
collected once per group with `--splits N --group G --collect-only`, and the node ids it keeps
are summed from the durations file. Run it from the repository root.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def shard(args: argparse.Namespace, group: int, durations: Path) -> list[str]:
    """The node ids pytest-split keeps for `group`."""
    command = [
        sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification", "-p",
        "no:cacheprovider", "--handoff-backend", args.backend, "--handoff-selection",
        args.selection, "--collect-only", "-q", "--splits", str(args.splits), "--group",
        str(group), "--durations-path", str(durations),
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "::test_migration[" in line]


def report(label: str, args: argparse.Namespace, durations: Path, recorded: dict) -> None:
    shards = [shard(args, g, durations) for g in range(1, args.splits + 1)]
    ids = [i for s in shards for i in s]
    if len(ids) != len(set(ids)) or not set(ids) <= set(recorded):
        raise SystemExit(f"{label}: a case is in two shards, or has no recorded duration")
    sums = [sum(recorded[i] for i in s) for s in shards]
    mean = statistics.mean(sums)
    cells = ", ".join(f"{len(s)} cases {t:.1f} s" for s, t in zip(shards, sums, strict=True))
    print(f"{label}: {cells}; largest / mean = {max(sums) / mean:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--durations", type=Path, default=Path("durations/mocker.json"))
    parser.add_argument("--splits", type=int, default=4)
    parser.add_argument("--selection", default="nightly")
    parser.add_argument("--backend", default="mocker")
    args = parser.parse_args()
    recorded = json.loads(args.durations.read_text())
    print(f"{len(recorded)} cases in {args.durations}, {sum(recorded.values()):.1f} s in all")
    report("recorded durations", args, args.durations, recorded)
    with tempfile.TemporaryDirectory() as empty:
        report("equal weights", args, Path(empty) / "none.json", recorded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
