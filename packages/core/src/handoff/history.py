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

    def since_start(self, monotonic_at: float) -> float:
        return round(monotonic_at - self.started, 4)

    @property
    def phase(self) -> str:
        return self.events[-1].name if self.events else "not started"

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        events = [{"event": e.name, "at": e.at, **e.data} for e in self.events]
        path.write_text(json.dumps(events, indent=2, default=str) + "\n")
