"""`handoff compare RUN_A RUN_B`: the verdict diff of two runs of one selection, typically the
release a team runs (A) against the one it wants (B).

Each case whose verdict or counters differ is one row, with its kind and its cause: the changes
handoff.releases records between the two runs' releases that explain it, else "a new finding"
(nothing recorded explains it: read its logs, then record the change or file the defect).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from pathlib import Path

from rich.console import Console
from rich.table import Table

from handoff import releases
from handoff.errors import HandoffError
from handoff.runs.report import write_html
from handoff.runs.results import CaseRecord, RunResults
from handoff.verdict import FAILED, KNOWN_DEFECT, NOT_PROVEN, PASSED

ABSENT = "absent"
#: The kinds of difference, in the order a reader meets them.
REGRESSION = "regression: passed before, fails now"
FIX_ARRIVED = "fix arrived: a known defect's case passes now"
NEW_DEFECT = "known defect now: passed before"
LOST_PROOF = "not proven now: passed before"
FLIPPED = "flipped"
MEANING = "counts differ: their meaning changed"
ONLY_A, ONLY_B = "only in A", "only in B"
#: What B no longer proves that A did: each fails the comparison (exit status 1).
WORSE = (REGRESSION, NEW_DEFECT, LOST_PROOF, ONLY_A)
NEW_FINDING = "a new finding: no recorded change explains it"


@dataclass(frozen=True)
class Difference:
    key: str
    before: str  # the outcome in A, or ABSENT
    after: str
    kind: str
    cause: str


def kind_of(
    before: CaseRecord | None, after: CaseRecord | None, meaning_changed: bool
) -> str | None:
    """How a case differs between the runs; None where it does not. Counts that differ in a
    case judged alike are a difference only where a release between the runs changed what the
    counters mean: elsewhere the case's own check judged them (a rolling restart's moves vary
    with the timing of its drains)."""
    if before is None or after is None:
        return ONLY_B if before is None else ONLY_A
    was, now = before.outcome, after.outcome
    if was == now:
        counted = before.counts and after.counts and before.counts != after.counts
        return MEANING if counted and meaning_changed else None
    if now == FAILED and was in (PASSED, KNOWN_DEFECT):
        return REGRESSION
    if was == KNOWN_DEFECT and now == PASSED:
        return FIX_ARRIVED
    if was == PASSED and now == KNOWN_DEFECT:
        return NEW_DEFECT
    if was == PASSED and now == NOT_PROVEN:
        return LOST_PROOF
    return FLIPPED


def cause_of(kind: str, before: CaseRecord | None, after: CaseRecord | None, changes) -> str:
    """The recorded changes between the releases that explain a difference of `kind`."""
    if kind in (ONLY_A, ONLY_B):
        return "the selection differs: a case added or retired between the runs' handoff"
    defect = (before and before.upstream_defect) or (after and after.upstream_defect) or ""
    fields = {MEANING: ("counts_refused_moves",), FIX_ARRIVED: ("fixed",), NEW_DEFECT: ("fixed",)}
    found = [
        f"{version}: {change.cause}"
        for version, change in changes
        if change.field in fields.get(kind, ())
        and (change.field != "fixed" or any(issue in defect for issue in change.value))
    ]
    return "; ".join(found) or NEW_FINDING


def compare(a: RunResults, b: RunResults) -> list[Difference]:
    """Every case that differs between `a` and `b`, by key."""
    if a.selection != b.selection or a.backend != b.backend:
        raise HandoffError(
            f"the runs are of {a.backend}/{a.selection} and {b.backend}/{b.selection}: compare "
            f"two runs of one backend's selection"
        )
    changes = releases.changes_between(a.dynamo, b.dynamo) if a.dynamo and b.dynamo else []
    meaning_changed = any(change.field == "counts_refused_moves" for _, change in changes)
    before = {c.key: c for c in a.cases}
    after = {c.key: c for c in b.cases}
    differences = []
    for key in sorted(before.keys() | after.keys()):
        was, now = before.get(key), after.get(key)
        kind = kind_of(was, now, meaning_changed)
        if kind is not None:
            outcomes = (c.outcome if c else ABSENT for c in (was, now))
            differences.append(Difference(key, *outcomes, kind, cause_of(kind, was, now, changes)))
    return differences


def table(a: RunResults, b: RunResults, differences: list[Difference]) -> Table:
    title = f"{a.backend}/{a.selection}: A = Dynamo {a.dynamo or '?'}, B = Dynamo {b.dynamo or '?'}"
    grid = Table(title=title, title_justify="left")
    for column in ("case", "A", "B", "difference", "cause"):
        grid.add_column(column, overflow="fold")
    for d in differences:
        grid.add_row(d.key, d.before, d.after, d.kind, d.cause)
    return grid


@dataclass(frozen=True)
class Changed:
    """A fact of the releases that differs between the runs: each run was judged by its own."""

    name: str
    before: str
    after: str
    why_before: str
    why_after: str


def recorded_changes(a: RunResults, b: RunResults) -> list[Changed]:
    """The facts handoff judges by that differ between the runs' releases, each value with its
    cause: a behaviour recorded there differs between the runs with no verdict that differs."""
    if not a.dynamo or not b.dynamo or a.dynamo == b.dynamo:
        return []
    names = dict.fromkeys(c.field for _, c in releases.changes_between(a.dynamo, b.dynamo))
    old, new = releases.facts(a.dynamo), releases.facts(b.dynamo)
    return [
        Changed(
            name,
            shown(getattr(old, name)),
            shown(getattr(new, name)),
            releases.set_by(a.dynamo, name),
            releases.set_by(b.dynamo, name),
        )
        for name in names
        if getattr(old, name) != getattr(new, name)
    ]


def shown(value: object) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def changes_table(a: RunResults, b: RunResults, changes: list[Changed]) -> Table:
    grid = Table(title="what the releases differ in, each run judged by its own release's entry")
    for column in ("what", f"A ({a.dynamo})", f"B ({b.dynamo})", "why A", "why B"):
        grid.add_column(column, overflow="fold")
    for c in changes:
        grid.add_row(c.name, c.before, c.after, c.why_before, c.why_after)
    return grid


def html_section(a: RunResults, b: RunResults, differences: list[Difference]) -> str:
    """The comparison as a section of B's report.html."""
    rows = "".join(
        f"<tr><td>{escape(d.key)}</td><td>{escape(d.before)}</td><td>{escape(d.after)}</td>"
        f"<td>{escape(d.kind)}</td><td>{escape(d.cause)}</td></tr>"
        for d in differences
    )
    head = "<tr><th>case</th><th>A</th><th>B</th><th>difference</th><th>cause</th></tr>"
    summary = f"{len(differences)} difference(s)" if differences else "no difference"
    changes = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in vars(c).values()) + "</tr>"
        for c in recorded_changes(a, b)
    )
    heads = "".join(f"<th>{h}</th>" for h in ("what", "A", "B", "why A", "why B"))
    recorded = (
        f"<h3>What the releases differ in</h3><table><tr>{heads}</tr>{changes}</table>"
        if changes
        else ""
    )
    return (
        f'<section id="compare"><h2>Compared with {escape(a.run_dir)} (Dynamo '
        f"{escape(a.dynamo or '?')}): {summary}</h2>"
        f"<table>{head}{rows}</table>{recorded}</section>"
    )


def main(run_a: Path, run_b: Path, console: Console | None = None) -> int:
    """Print the diff and add it to B's report.html; exit 1 where B proves less than A
    (`WORSE`), or B's run ended in error."""
    a, b = RunResults.load(run_a), RunResults.load(run_b)
    differences = compare(a, b)
    console = console or Console(width=max(Console().width, 160))
    if differences:
        console.print(table(a, b, differences))
    if changes := recorded_changes(a, b):
        console.print(changes_table(a, b, changes))
    verdict = f"{len(differences)} difference(s)" if differences else "no difference"
    console.print(f"{verdict} between {run_a} and {run_b}", markup=False, highlight=False)
    if b.error:
        console.print(f"{run_b} ended in error: {b.error}", markup=False, highlight=False)
    path = write_html(b, run_b, extra=html_section(a, b, differences))
    console.print(f"report: {path}", markup=False, highlight=False, soft_wrap=True)
    return 1 if b.error or any(d.kind in WORSE for d in differences) else 0
