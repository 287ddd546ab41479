"""Rendering a run's results for a reader: the case table (terminal and `handoff report`), the
failed cases in words, and report.html, one self-contained page with a timeline per case."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape as escape_markup
from rich.table import Table
from rich.text import Text

from handoff.errors import HandoffError
from handoff.runs.lanes import lanes_svg
from handoff.runs.results import CaseRecord, RunResults, tally
from handoff.verdict import FAILED, KNOWN_DEFECT, NOT_PROVEN, PASSED

HTML_FILE = "report.html"
HISTORY_FILE = "history.json"
#: How each outcome is drawn in the terminal's table, and its class on report.html.
STYLES = {PASSED: "green", KNOWN_DEFECT: "yellow", NOT_PROVEN: "bold magenta", FAILED: "bold red"}
CLASSES = {PASSED: "pass", KNOWN_DEFECT: "xfail", NOT_PROVEN: "unproven", FAILED: "fail"}


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
        key, verdict, total, gap, migrations, reason = _cells(case)
        style = STYLES[case.outcome]
        table.add_row(key, Text(verdict, style=style), total, gap, migrations, Text(reason))
    return table


def _cells(case: CaseRecord) -> list[str]:
    """The table's cells as plain text: case, verdict, total s, fault→token ms, migrations,
    reason."""
    gap = case.phases.get("fault_to_next_token_ms")
    p99 = case.phases.get("fault_to_next_token_p99_ms")  # a load case: p50/p99 of its cut streams
    return [
        case.key,
        case.verdict,
        f"{case.seconds:.1f}",
        "" if gap is None else f"{gap:.0f}" if p99 is None else f"{gap:.0f}/{p99:.0f}",
        str(case.migrations) if case.counts else "",
        reason(case),
    ]


def reason(case: CaseRecord) -> str:
    """Why the case is not a pass, in one cell: a failure's reasons; a known defect's issue
    (the promise it breaks goes under the table); the checks a case not proven left unmade."""
    issue = case.upstream_defect.partition(": ")[0]
    outcome = case.outcome
    if outcome == KNOWN_DEFECT:
        return issue
    if outcome == NOT_PROVEN:
        also = f" (and {issue}, as expected)" if issue else ""
        return "; ".join(case.unproven) + also
    return "; ".join(case.reasons)


# --- handoff report ----------------------------------------------------------------------------


def case_folder(run_dir: Path, case: CaseRecord) -> Path:
    """The case's folder under `run_dir` (a run folder may have been moved or downloaded since),
    else the folder the run recorded."""
    here = run_dir / case.key
    return here if here.is_dir() else Path(case.folder)


def event_line(event: dict[str, Any]) -> str:
    """`  1.052 s  request_sent  api=chat stream=True ...`"""
    details = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("event", "at"))
    return f"{event.get('at', 0):7.3f} s  {event.get('event', '?')}  {details}".rstrip()


def failure_lines(run_dir: Path, case: CaseRecord) -> list[str]:
    """What a reader of a failed case, or one not proven, needs first: where it failed, why
    (or which checks could not be made, and why), what happened last, and where its logs are."""
    if case.outcome == NOT_PROVEN:
        lines = [f"NOT PROVEN {case.key}"]
    else:
        lines = [f"FAIL {case.key} in {case.phase}"]
        lines += [f"  reason: {reason}" for reason in case.reasons]
    lines += [f"  not proven: {unmade}" for unmade in case.unproven]
    if case.deployment:
        lines.append(f"  workers: {case.deployment}")
    if case.last_events:
        lines.append("  last events:")
        lines += [f"    {event_line(e)}" for e in case.last_events]
    lines.append(f"  logs: {case_folder(run_dir, case)}")
    return lines


def report(run_dir: Path, console: Console | None = None) -> int:
    """`handoff report RUN_DIR`: the case table, each failed case and each case not proven in
    words, and report.html beside results.json. Exit status 1 when a case failed, or was not
    proven in a run that did not allow it (`RunResults.exit_status`), else 0."""
    results = RunResults.load(run_dir)
    console = console or Console(width=max(Console().width, 160))  # case keys are long
    if results.error:
        console.print(f"{run_dir}: {results.error}", markup=False, highlight=False)
    console.print(
        case_table(results.cases, title=f"handoff cases of {escape_markup(str(run_dir))}")
    )
    for case in sorted(results.failed + results.unproven, key=lambda c: c.key):
        for line in failure_lines(run_dir, case):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(tally(results.cases), highlight=False)
    path = write_html(results, run_dir)
    console.print(f"report: {path}", markup=False, highlight=False, soft_wrap=True)
    return results.exit_status


def write_html(results: RunResults, run_dir: Path, extra: str = "") -> Path:
    """report.html of the run, with `extra` (a section of HTML) after its cases."""
    path = run_dir / HTML_FILE
    try:
        path.write_text(html_report(results, run_dir.resolve(), extra))  # a page read anywhere
    except OSError as exc:
        raise HandoffError(f"cannot write {path} ({exc}): make the run folder writable") from None
    return path


def load_history(run_dir: Path, case: CaseRecord) -> tuple[list[dict[str, Any]], str]:
    """The case's events from its history.json, or none and why."""
    path = case_folder(run_dir, case) / HISTORY_FILE
    try:
        events = json.loads(path.read_text())
    except FileNotFoundError:
        return [], f"no {HISTORY_FILE} in {path.parent}"
    except (OSError, ValueError) as exc:
        return [], f"cannot read {path}: {exc}"
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        return [], f"{path} is not a list of events"
    return events, ""


# --- report.html -------------------------------------------------------------------------------

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { margin: 0 0 8px; } h2 { font-size: 15px; margin: 28px 0 6px; }
dl.run { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; }
dt { font-weight: 600; } dd { margin: 0; }
table.cases { border-collapse: collapse; margin-top: 16px; width: 100%; }
table.cases th, table.cases td { border: 1px solid #ccc; padding: 3px 8px; text-align: left;
  vertical-align: top; }
td.num { text-align: right; }
.pass { color: #18794e; font-weight: 600; } .fail { color: #c62828; font-weight: 600; }
.xfail { color: #9a6700; font-weight: 600; } .unproven { color: #8e24aa; font-weight: 600; }
.failure { border-left: 4px solid #c62828; padding: 4px 12px; background: #fff5f5; }
.unmade { border-left: 4px solid #8e24aa; padding: 4px 12px; background: #fbf5fd; }
pre { white-space: pre-wrap; margin: 4px 0; font-size: 12px; }
svg.timeline, svg.lanes { display: block; max-width: 100%; height: auto; background: #fafafa;
  border: 1px solid #ddd; }
.phases { color: #555; }
"""
COLORS = {
    "request_sent": "#1565c0",
    "fault_sent": "#c62828",
    "worker_gone": "#6a1b9a",
    "migration_seen": "#ef6c00",
    "response_finished": "#2e7d32",
}


def html_report(results: RunResults, run_dir: Path, extra: str = "") -> str:
    cases = sorted(results.cases, key=lambda c: c.key)
    header = [
        ("backend", results.backend),
        ("selection", results.selection),
        ("Dynamo", results.dynamo or "unknown"),
        *([("mixed with", f"{results.beside}: {results.mix}")] if results.mix else []),
        ("run folder", str(run_dir)),
        ("wall time", f"{results.wall_s:.1f} s"),
        ("cases", tally(cases)),
        *([("error", results.error)] if results.error else []),
    ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>handoff report: {escape(results.backend)} {escape(results.selection)}</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>handoff report</h1>",
        '<dl class="run">',
        *(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in header),
        "</dl>",
        cases_table(cases),
    ]
    for n, case in enumerate(cases, 1):
        parts.append(case_section(n, case, run_dir))
    parts += [extra, "</body></html>"]
    return "\n".join(parts) + "\n"


def cases_table(cases: Sequence[CaseRecord]) -> str:
    heads = ["case", "verdict", "total s", "fault→token ms", "migrations", "reason", "notes"]
    rows = ["<tr>" + "".join(f"<th>{escape(h)}</th>" for h in heads) + "</tr>"]
    for n, case in enumerate(cases, 1):
        key, verdict, total, gap, migrations, reason = _cells(case)
        rows.append(
            "<tr>"
            f'<td class="key"><a href="#case-{n}">{escape(key)}</a></td>'
            f'<td class="{CLASSES[case.outcome]}">{escape(verdict)}</td>'
            f'<td class="num">{total}</td><td class="num">{gap}</td>'
            f'<td class="num">{migrations}</td>'
            f"<td>{escape(reason)}</td><td>{escape('; '.join(case.notes))}</td>"
            "</tr>"
        )
    return '<table class="cases">' + "\n".join(rows) + "</table>"


def case_section(n: int, case: CaseRecord, run_dir: Path) -> str:
    verdict = case.verdict
    phases = ", ".join(f"{k} {v:g}" for k, v in case.phases.items())
    parts = [
        f'<section id="case-{n}">',
        f'<h2>{escape(case.key)} <span class="{CLASSES[case.outcome]}">'
        f"{escape(verdict)}</span></h2>",
        f'<div class="phases">{escape(phases)}</div>',
        f'<div class="phases">workers: {escape(case.deployment or "not drawn")}</div>',
    ]
    if not case.passed:
        parts += failure_block(case, run_dir)
    events, why = load_history(run_dir, case)
    parts += [timeline_svg(case.key, events, why), lanes_svg(case.key, events), "</section>"]
    return "\n".join(parts)


def failure_block(case: CaseRecord, run_dir: Path) -> list[str]:
    """A case that did not pass, on the page: where it failed and why, or the checks it could
    not make and why; its last events and its logs."""
    last_events = "\n".join(event_line(e) for e in case.last_events)
    if case.outcome == NOT_PROVEN:
        head = ['<div class="unmade">', "<div><b>not proven</b>: checks not made:</div>"]
        head += [f"<pre>{escape(u)}</pre>" for u in case.unproven]
    else:
        head = ['<div class="failure">', f"<div>failed in phase <b>{escape(case.phase)}</b></div>"]
        head += ["<div>reasons:</div>", *(f"<pre>{escape(r)}</pre>" for r in case.reasons)]
        head += [f"<pre>not proven besides: {escape(u)}</pre>" for u in case.unproven]
    return [
        *head,
        "<div>last events:</div>",
        f"<pre>{escape(last_events or '(none recorded)')}</pre>",
        f"<div>logs: <code>{escape(str(case_folder(run_dir, case)))}</code></div>",
        "</div>",
    ]


# --- the timeline ------------------------------------------------------------------------------

WIDTH, LEFT, RIGHT = 1000, 60, 20
ROWS, ROW_H = len(COLORS), 13  # a row of labels for each kind of marker, above the plot
TOP = 10 + ROWS * ROW_H
PLOT_H, BOTTOM = 120, 30
HEIGHT = TOP + PLOT_H + BOTTOM
CHAR_W = 6.2  # about the width of one character of the 11px labels


def timeline_svg(key: str, events: list[dict[str, Any]], why_empty: str = "") -> str:
    """The case over time: start-up shaded, the tokens received as a step line (one dot for a
    unary response), and a marker at each step of the fault."""
    head = (
        f'<svg class="timeline" data-case="{escape(key)}" '
        f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        'font-family="sans-serif" font-size="11">'
        f"<title>{escape(f'timeline of {key}')}</title>"
    )
    if not events:
        note = why_empty or "no events recorded"
        return head + f'<text x="{LEFT}" y="{TOP + 20}">{escape(note)}</text></svg>'
    end = max(float(e.get("at", 0)) for e in events) or 1.0
    scale = (WIDTH - LEFT - RIGHT) / end

    def x(t: float) -> float:
        return round(LEFT + float(t) * scale, 1)

    parts = [head, start_up(events, x), axis(end, x)]
    parts.append(tokens(events, x))
    parts.append(markers(events, x))
    return "".join(parts) + "</svg>"


def first(events: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((e for e in events if e.get("event") == name), None)


def start_up(events: list[dict[str, Any]], x) -> str:
    """launch→ready shaded; a deployment never ready is shaded to its last event."""
    launch = first(events, "launch")
    if launch is None:
        return ""
    ready = first(events, "ready")
    until = ready["at"] if ready else events[-1]["at"]
    label = f"start-up {until - launch['at']:.2f} s" + ("" if ready else " (never ready)")
    x0, x1 = x(launch["at"]), x(until)
    return (
        f'<rect class="start-up" x="{x0}" y="{TOP}" width="{max(x1 - x0, 1)}" '
        f'height="{PLOT_H}" fill="#e0e0e0"><title>{escape(label)}</title></rect>'
        f'<text x="{x0 + 4}" y="{TOP + PLOT_H - 6}" fill="#555">{escape(label)}</text>'
    )


def axis(end: float, x) -> str:
    """The time axis in seconds, with about ten ticks."""
    step = nice_step(end / 10)
    base = TOP + PLOT_H
    parts = [f'<line x1="{LEFT}" y1="{base}" x2="{WIDTH - RIGHT}" y2="{base}" stroke="#888"/>']
    for i in range(int(end / step + 1e-9) + 1):
        t = i * step
        parts.append(
            f'<line x1="{x(t)}" y1="{base}" x2="{x(t)}" y2="{base + 4}" stroke="#888"/>'
            f'<text x="{x(t)}" y="{base + 16}" text-anchor="middle" fill="#555">{t:g}</text>'
        )
    parts.append(f'<text x="{WIDTH - RIGHT}" y="{base + 28}" text-anchor="end">seconds</text>')
    return "".join(parts)


def nice_step(rough: float) -> float:
    """1, 2 or 5 times a power of ten, at least `rough`."""
    power = 10 ** math.floor(math.log10(rough)) if rough > 0 else 1.0
    return next(m * power for m in (1, 2, 5, 10) if m * power >= rough)


def tokens(events: list[dict[str, Any]], x) -> str:
    """A stream: the count of content chunks received so far, as a step line. A unary response
    arrives whole: one dot at its arrival."""
    request = first(events, "request_sent")
    chunks = [e for e in events if e.get("event") == "chunk" and e.get("text")]
    if request is None or not chunks:
        return ""
    if not request.get("stream"):
        at = chunks[0]["at"]
        return (
            f'<circle class="arrival" cx="{x(at)}" cy="{TOP + 8}" r="5" fill="#2e7d32">'
            f"<title>{escape(f'unary response arrived whole at {at:.3f} s')}</title></circle>"
            f'<text x="{x(at) - 8}" y="{TOP + 12}" text-anchor="end">response arrived</text>'
        )
    total = len(chunks)

    def y(n: int) -> float:
        return round(TOP + PLOT_H - n * (PLOT_H - 10) / total, 1)

    points: dict[float, int] = {x(request["at"]): 0}  # one point per x: the count there
    for n, chunk in enumerate(chunks, 1):
        points[x(chunk["at"])] = n
    path = f"M{x(request['at'])},{y(0)}"
    for px, n in points.items():
        path += f"H{px}V{y(n)}"
    finished = first(events, "response_finished")
    if finished:
        path += f"H{x(finished['at'])}"
    return (
        f'<path class="tokens" d="{path}" fill="none" stroke="#1565c0" stroke-width="1.5">'
        f"<title>{total} content chunks received</title></path>"
        f'<text x="{LEFT - 6}" y="{y(total) + 4}" text-anchor="end">{total}</text>'
        f'<text x="{LEFT - 6}" y="{y(0)}" text-anchor="end">0</text>'
        f'<text x="{LEFT - 6}" y="{TOP + PLOT_H / 2}" text-anchor="end">tokens</text>'
    )


def marker_label(event: dict[str, Any]) -> str:
    name = event["event"]
    if name == "fault_sent":
        return f"{event.get('signal', event.get('fault', 'fault'))} → {event.get('worker', '?')}"
    if name == "worker_gone":
        return "worker gone"
    if name == "response_finished":
        return "response failed" if event.get("failed") else "response finished"
    return name.replace("_", " ")


def markers(events: list[dict[str, Any]], x) -> str:
    """A vertical line for each step of the fault, labelled in the first free row above."""
    parts, row_end = [], [-math.inf] * ROWS
    for event in events:
        if event.get("event") not in COLORS:
            continue
        at, color, label = event["at"], COLORS[event["event"]], marker_label(event)
        width = len(label) * CHAR_W
        # Right of the line, or left of it where it would run off the edge.
        left = x(at) + width + 2 > WIDTH
        start = x(at) - width - 2 if left else x(at)
        row = next((r for r in range(ROWS) if row_end[r] < start), ROWS - 1)
        row_end[row] = start + width + 8
        details = ", ".join(f"{k}={v}" for k, v in event.items() if k not in ("event", "at"))
        hover = f"{event['event']} at {at:.3f} s" + (f": {details}" if details else "")
        label_y = 10 + (row + 1) * ROW_H - 3
        parts.append(
            f'<g class="marker {escape(event["event"])}"><title>{escape(hover)}</title>'
            f'<line x1="{x(at)}" y1="{label_y + 3}" x2="{x(at)}" y2="{TOP + PLOT_H}" '
            f'stroke="{color}" stroke-width="1.5" stroke-dasharray="4 2"/>'
            f'<text x="{x(at) + (-2 if left else 2)}" y="{label_y}" fill="{color}" '
            f'text-anchor="{"end" if left else "start"}">{escape(label)}</text></g>'
        )
    return "".join(parts)
