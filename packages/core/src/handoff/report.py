"""Rendering a run's results for a reader: the case table (terminal and `handoff report`)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from handoff.results import CaseRecord


def case_table(cases: Sequence[CaseRecord], title: str = "handoff cases") -> Table:
    """One row per case: verdict, seconds, fault to next token, migrations, why it failed."""
    table = Table(title=title, title_justify="left")
    table.add_column("case", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("total s", justify="right", no_wrap=True)
    table.add_column("fault→token ms", justify="right", no_wrap=True)
    table.add_column("migrations", justify="right", no_wrap=True)
    table.add_column("reason")
    for case in sorted(cases, key=lambda c: c.key):
        gap = case.phases.get("fault_to_next_token_ms")
        verdict = (
            Text("PASS", style="green")
            if case.passed
            else Text(f"FAIL in {case.phase}", style="bold red")
        )
        table.add_row(
            case.key,
            verdict,
            f"{case.seconds:.1f}",
            "" if gap is None else f"{gap:.0f}",
            str(case.migrations) if case.counts else "",
            Text("; ".join(case.reasons)),
        )
    return table
