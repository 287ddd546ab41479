"""A live progress line on a terminal while cases run: done, running, failed, not proven,
elapsed."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.text import Text


class LiveProgress:
    """Counts cases as pytest starts and ends them; drawn on stderr, gone when the run ends."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.total = 0
        self.running: set[str] = set()
        self.done = self.failed = self.unproven = 0
        self.since = time.monotonic()
        self.live: Live | None = None

    def render(self) -> Text:
        elapsed = time.monotonic() - self.since
        line = Text("handoff: ")
        line.append(f"{self.done}/{self.total} done", style="bold")
        line.append(f", {len(self.running)} running, ")
        line.append(f"{self.failed} failed", style="bold red" if self.failed else "")
        if self.unproven:
            line.append(f", {self.unproven} not proven", style="bold magenta")
        line.append(f", {elapsed:.0f} s")
        return line

    def start(self, total: int) -> None:
        self.total = total
        self.live = Live(
            console=self.console,
            transient=True,
            refresh_per_second=2,  # so the elapsed time moves between cases
            get_renderable=self.render,
            redirect_stdout=False,  # pytest owns stdout
            redirect_stderr=False,
        )
        self.live.start()

    def started(self, nodeid: str) -> None:
        self.running.add(nodeid)
        self._draw()

    def finished(self, nodeid: str, passed: bool, unproven: bool = False) -> None:
        """A case ended: passed (or an expected failure), failed, or not proven (`unproven`,
        whether the run allows it or not)."""
        if nodeid in self.running:
            self.running.discard(nodeid)
            self.done += 1
            self.unproven += unproven
            self.failed += not passed and not unproven
        self._draw()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def _draw(self) -> None:
        if self.live is not None:
            self.live.refresh()
