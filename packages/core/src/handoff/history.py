"""The timeline of one case, kept as JSON beside its logs so a reader can see what happened."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any


@dataclass
class Event:
    name: str
    at: float  # seconds since the case started, monotonic
    data: dict[str, Any] = field(default_factory=dict)


class History:
    """Events in the order they happened; `phase` is the last one reached."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.events: list[Event] = []

    def record(self, name: str, **data: Any) -> None:
        self.record_at(name, time.monotonic(), **data)

    def record_at(self, name: str, when: float, **data: Any) -> None:
        """An event observed elsewhere (a chunk, the response headers) at monotonic `when`."""
        self.events.append(Event(name, round(when - self.started, 4), data))

    def timeline(self) -> list[Event]:
        """Every event in time order (a stable sort: simultaneous ones keep their order)."""
        return sorted(self.events, key=lambda e: e.at)

    def moments(self, names: tuple[str, ...]) -> str:
        """When each of `names` first happened, in seconds from the start, those reached."""
        first: dict[str, float] = {}
        for event in self.timeline():
            first.setdefault(event.name, event.at)
        return ", ".join(f"{name} at {first[name]:.2f} s" for name in names if name in first)

    @property
    def phase(self) -> str:
        return self.events[-1].name if self.events else "not started"

    def phases(self) -> dict[str, float]:
        """What a reader compares across cases, for the phases the case reached: start-up,
        time to first token, time from the fault to the next token (ms), and the total."""
        at: dict[str, float] = {}
        for e in self.timeline():
            at.setdefault(e.name, e.at)
        spans = {
            "ready_s": ("launch", "ready"),
            "ttft_s": ("request_sent", "chunk"),
            "request_s": ("request_sent", "response_finished"),
            "fault_to_end_s": ("fault_sent", "response_finished"),
            "total_s": ("launch", "teardown_done"),
        }
        phases = {
            name: round(at[end] - at[start], 3)
            for name, (start, end) in spans.items()
            if start in at and end in at
        }
        load = next((e.data["requests"] for e in self.events if e.name == "load_accounted"), None)
        if load is not None:  # many streams: the pause of each the fault cut and moved, p50, p99
            ends = [e.at for e in self.events if e.name == "response_finished"]
            if "fault_sent" in at and ends:
                phases["fault_to_end_s"] = round(max(ends) - at["fault_sent"], 3)
            moved = [r for r in load if r.get("cut") and not r.get("failed")]
            pauses = [r.get("fault_to_next_token_ms") for r in moved]
            if pauses := [p for p in pauses if p is not None]:
                phases["fault_to_next_token_ms"] = percentile(pauses, 50)
                phases["fault_to_next_token_p99_ms"] = percentile(pauses, 99)
        elif (gap := self.fault_to_next_token_s()) is not None:
            phases["fault_to_next_token_ms"] = round(gap * 1000, 1)
        return phases

    def fault_to_next_token_s(self) -> float | None:
        """From the first signal to the first token after the migration's stall (`resumption_s`)
        of the case's one stream."""
        fault = next((e.at for e in self.events if e.name == "fault_sent"), None)
        chunks = [e.at for e in self.timeline() if e.name == "chunk"]
        return None if fault is None else resumption_s(chunks, fault)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        events = [{"event": e.name, "at": e.at, **e.data} for e in self.timeline()]
        path.write_text(json.dumps(events, indent=2, default=str) + "\n")


def resumption_s(chunks: list[float], fault: float) -> float | None:
    """From `fault` to the first token after the longest pause in a stream read at `chunks`
    (monotonic times, in order) from the fault on. Tokens already on their way when the signal
    went out arrive before that pause, so the first chunk after the fault is not the one. None
    for a stream with no token after the fault, or a unary response (one chunk: no next token)."""
    after = [t for t in chunks if t >= fault]
    if len(chunks) < 2 or not after:
        return None
    times = [t for t in chunks if t < fault][-1:] + after
    resumed = max(pairwise(times), key=lambda p: p[1] - p[0], default=None)
    return (resumed[1] if resumed else after[0]) - fault


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile `q` of `values`: one of them, never an interpolation."""
    ranked = sorted(values)
    return ranked[max(math.ceil(q / 100 * len(ranked)) - 1, 0)]
