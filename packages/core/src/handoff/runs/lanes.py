"""A load case drawn for report.html: one lane per request, its tokens over time coloured by
the worker that sent them, the fault and the frontend's first counted migration marked, so
that a reader sees at a glance which requests the loss cut, how long they paused, and how the
others were disturbed."""

from __future__ import annotations

from html import escape
from itertools import pairwise
from typing import Any

WIDTH, LEFT, RIGHT, TOP = 1000, 190, 20, 28
LANE_H, BAR_H, BOTTOM = 18, 10, 34
#: Tokens closer than this are drawn as one bar: the pauses that matter are a migration's.
JOINED_S = 0.25
PALETTE = ("#1565c0", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#5d4037", "#9e9d24")
FAILED, FAULT, MOVE = "#c62828", "#c62828", "#ef6c00"


def lanes_svg(key: str, events: list[dict[str, Any]]) -> str:
    """The lanes of a load case's history (`requests_sent`, `load_accounted` and the chunk and
    `response_finished` events labelled with their request); empty for any other case."""
    sent = next((e for e in events if e.get("event") == "requests_sent"), None)
    rows = next((e["requests"] for e in events if e.get("event") == "load_accounted"), None)
    if sent is None or rows is None:
        return ""
    fault = next((e for e in events if e.get("event") == "fault_sent"), None)
    moved = next((e for e in events if e.get("event") == "migration_seen"), None)
    ended = {e.get("request"): e for e in events if e.get("event") == "response_finished"}
    chunks: dict[int, list[float]] = {}
    for e in events:
        if e.get("event") == "chunk" and e.get("text") and e.get("request") is not None:
            chunks.setdefault(e["request"], []).append(float(e["at"]))
    start = float(sent["at"])
    end = max([float(e["at"]) for e in ended.values()] + [start + 1.0])
    scale = (WIDTH - LEFT - RIGHT) / (end - start)

    def x(t: float) -> float:
        return round(LEFT + (t - start) * scale, 1)

    workers = sorted({w for r in rows for w in r.get("workers") or [r.get("worker")] if w})
    color = {w: PALETTE[i % len(PALETTE)] for i, w in enumerate(workers)}
    height = TOP + LANE_H * len(rows) + BOTTOM
    parts = [
        f'<svg class="lanes" data-case="{escape(key)}" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">'
        f"<title>{escape(f'every request of {key} over time')}</title>",
        legend(color),
    ]
    for i, row in enumerate(sorted(rows, key=lambda r: r["n"])):
        y = TOP + i * LANE_H
        finished = ended.get(row["n"])
        parts.append(lane(row, y, x, start, finished, chunks.get(row["n"], []), fault, color))
    base = TOP + LANE_H * len(rows)
    for event, tint, label in ((fault, FAULT, "fault"), (moved, MOVE, "migration counted")):
        if event is None:
            continue
        at, when = x(float(event["at"])), float(event["at"])
        words = f"{event.get('signal', '')} → {event.get('worker', '')}" if event is fault else ""
        hover = escape(f"{label} at {when:.3f} s")
        parts.append(
            f'<g class="{label.split()[0]}"><title>{hover}</title>'
            f'<line x1="{at}" y1="{TOP - 4}" x2="{at}" y2="{base}" stroke="{tint}" '
            f'stroke-width="1.5" stroke-dasharray="4 2"/>'
            f'<text x="{at + 3}" y="{base + 14 if event is fault else base + 28}" '
            f'fill="{tint}">{escape(words or label)}</text></g>'
        )
    parts.append(
        f'<text x="{WIDTH - RIGHT}" y="{base + 28}" text-anchor="end" fill="#555">'
        f"{end - start:.1f} s from the requests sent</text></svg>"
    )
    return "".join(parts)


def legend(color: dict[str, str]) -> str:
    parts, at = [], LEFT
    for worker, tint in [*color.items(), ("an error", FAILED)]:
        parts.append(
            f'<rect x="{at}" y="6" width="10" height="10" fill="{tint}"/>'
            f'<text x="{at + 14}" y="15">{escape(worker)}</text>'
        )
        at += 24 + len(worker) * 6.2
    return "".join(parts)


def lane(
    row: dict[str, Any],
    y: float,
    x,
    start: float,
    finished: dict[str, Any] | None,
    chunks: list[float],
    fault: dict[str, Any] | None,
    color: dict[str, str],
) -> str:
    """One request: its label, the span it was open, its tokens as bars (a unary response as
    one mark at its arrival), each in the colour of the worker that sent it."""
    kind = "stream" if row.get("stream") else "unary"
    cut = " cut" if row.get("cut") else ""
    label = f"{row['n']} {kind}, {row.get('state') or '?'}{cut}"
    served = row.get("workers") or [row.get("worker")]
    first_worker, last_worker = served[0], served[-1]
    fault_at = float(fault["at"]) if fault else float("inf")
    until = float(finished["at"]) if finished else start
    failed = bool(row.get("failed"))
    middle = y + LANE_H / 2
    parts = [
        f'<g class="lane" data-request="{row["n"]}"><title>{escape(summary(row, finished))}'
        f"</title>",
        f'<text x="{LEFT - 6}" y="{middle + 4}" text-anchor="end">{escape(label)}</text>',
        f'<line x1="{x(start)}" y1="{middle}" x2="{x(until)}" y2="{middle}" stroke="#bbb"/>',
    ]
    for first, last in bars(chunks):
        tint = color.get(first_worker if first < fault_at else last_worker, "#888")
        parts.append(
            f'<rect x="{x(first)}" y="{middle - BAR_H / 2}" width="{max(x(last) - x(first), 1)}"'
            f' height="{BAR_H}" fill="{tint}"/>'
        )
    if finished and (failed or not chunks):
        tint = FAILED if failed else color.get(last_worker, "#888")
        parts.append(f'<circle cx="{x(until)}" cy="{middle}" r="4" fill="{tint}"/>')
    parts.append("</g>")
    return "".join(parts)


def bars(chunks: list[float]) -> list[tuple[float, float]]:
    """Runs of tokens, each a (first, last) time, split where the gap exceeds JOINED_S."""
    if not chunks:
        return []
    runs, first = [], chunks[0]
    for before, after in pairwise(chunks):
        if after - before > JOINED_S:
            runs.append((first, before))
            first = after
    runs.append((first, chunks[-1]))
    return runs


def summary(row: dict[str, Any], finished: dict[str, Any] | None) -> str:
    said = f"request {row['n']}: held by {' then '.join(row.get('workers') or [row['worker']])}"
    if (pause := row.get("fault_to_next_token_ms")) is not None:
        said += f"; {pause:.0f} ms from the fault to its next token"
    return said + (f"; {finished.get('response')}" if finished else "")
