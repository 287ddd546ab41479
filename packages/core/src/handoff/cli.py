"""`handoff`: list backends and their cases. Errors are one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from handoff.cases import SELECTIONS, TOPOLOGIES, promise, selection, topology, unmet
from handoff.errors import HandoffError
from handoff.plugins import get_backend, load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="handoff", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("backends", help="installed backends, versions and topologies")
    cases = commands.add_parser("cases", help="case ids of a backend's selection")
    cases.add_argument("--backend", required=True)
    cases.add_argument("--selection", default="pre_merge", choices=SELECTIONS)
    cases.add_argument(
        "--topology", action="append", help="repeatable; default: every topology there is"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "backends":
            return list_backends()
        return list_cases(args.backend, args.topology, args.selection)
    except HandoffError as exc:
        print(f"handoff: error: {exc}", file=sys.stderr)
        return 2


def list_backends() -> int:
    """The backends that loaded; each broken plugin as one line on stderr, and exit 1."""
    table = Table("backend", "version", "topologies", "migration counts")
    loaded = load()
    for name, backend in sorted(loaded.backends.items()):
        table.add_row(
            name, backend.version, ", ".join(backend.topologies), backend.migration_counts
        )
    Console().print(table)
    for problem in loaded.broken.values():
        print(f"handoff: error: {problem}", file=sys.stderr)
    return 1 if loaded.broken else 0


def list_cases(backend_name: str, topologies: list[str] | None, selection_name: str) -> int:
    """Each topology's ids under a `#` header with its promise, or why the backend skips it.
    Exits 1 when a selection breaks its promise."""
    backend = get_backend(backend_name)
    broken = False
    for name in topologies or list(TOPOLOGIES):
        topology(name)
        if why := backend.why_not(name):
            print(f"# {name}: not run by {backend_name}: {why}")
            continue
        chosen = selection(name, selection_name)
        kept = promise(name, selection_name)
        missing = unmet(name, chosen, kept)
        broken = broken or bool(missing)
        full = len(selection(name, "nightly"))
        status = "holds" if not missing else "BROKEN, missing " + "; ".join(missing)
        print(
            f"# {name} {selection_name}: {len(chosen)} of {full} rows; {kept.describe()}: {status}"
        )
        for case in chosen:
            print(case.id)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
