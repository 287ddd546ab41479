"""The timeline of one case, kept as JSON beside its logs so a reader can see what happened."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
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
        self.events.append(Event(name, round(time.monotonic() - self.started, 4), data))

    @property
    def phase(self) -> str:
        return self.events[-1].name if self.events else "not started"

    def phases(self) -> dict[str, float]:
        """Seconds spent in the phases a reader compares, for those the case reached."""
        at: dict[str, float] = {}
        for e in self.events:
            at.setdefault(e.name, e.at)
        spans = {
            "ready_s": ("launch", "ready"),
            "request_s": ("request_sent", "response_finished"),
            "fault_to_end_s": ("fault_sent", "response_finished"),
            "total_s": ("launch", "teardown_done"),
        }
        return {
            name: round(at[end] - at[start], 3)
            for name, (start, end) in spans.items()
            if start in at and end in at
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        events = [{"event": e.name, "at": e.at, **e.data} for e in self.events]
        path.write_text(json.dumps(events, indent=2, default=str) + "\n")
