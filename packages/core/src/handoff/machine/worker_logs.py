"""What workers' logs say of the requests they received, read incrementally: a case polls them
every few milliseconds while its requests are placed, and a pooled worker's log grows over many
cases, so each read takes only what was written since the last."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol


class _Logging(Protocol):
    log_path: Path


class Logged(Protocol):
    """A worker, as far as its log goes (`backend.Worker`)."""

    name: str
    process: _Logging


#: Dynamo's worker log line for a request it received, with the request id (the response id
#: without its `chatcmpl-` or `cmpl-` prefix).
RECEIVED = re.compile(r"^(\S+Z)\s.*\brequest received request_id=(\S+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def matching(path: Path, pattern: re.Pattern[str]) -> list[str]:
    """The lines of the whole log at `path` that `pattern` finds, colours removed (OSError
    where it cannot be read)."""
    text = ANSI.sub("", path.read_text(errors="replace"))
    return [line for line in text.splitlines() if pattern.search(line)]


class Tail:
    """A log's whole lines, ANSI colours removed, each read taking only those written since the
    last; a log that shrank (rewritten) is read again from its start, and `restarted` says so
    until the next read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.restarted = False

    def new_lines(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        self.restarted = size < self.offset
        if self.restarted:
            self.offset, self.partial = 0, b""
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        self.offset += len(data)
        *whole, self.partial = (self.partial + data).split(b"\n")
        return [ANSI.sub("", raw.decode(errors="replace")) for raw in whole]


class Receipts:
    """The `request received` lines of one log, as (timestamp, request id), kept up to date
    from its `Tail`; a log rewritten shorter is read again from its start."""

    def __init__(self, path: Path) -> None:
        self.tail = Tail(path)
        self.seen: list[tuple[str, str]] = []

    def read(self) -> list[tuple[str, str]]:
        lines = self.tail.new_lines()
        if self.tail.restarted:
            self.seen = []
        for line in lines:
            if "request received" in line and (found := RECEIVED.match(line)):
                self.seen.append((found.group(1), found.group(2)))
        return self.seen


_READERS: dict[Path, Receipts] = {}


def receipts(log: Path) -> list[tuple[str, str]]:
    """(timestamp, request id) of each `request received` line of a worker's log, in order."""
    reader = _READERS.get(log)
    if reader is None:
        reader = _READERS[log] = Receipts(log)
    return reader.read()


def received(workers: Iterable[Logged], ids: set[str]) -> dict[str, list[str]]:
    """By request id, the workers whose logs say they received it, in the order they did (by
    their logs' timestamps): a request a worker has taken, whether it decodes it yet or not,
    and after a move the worker it moved to."""
    seen: dict[str, list[tuple[str, str]]] = {}
    for worker in workers:
        for stamp, request_id in receipts(worker.process.log_path):
            if request_id in ids:
                seen.setdefault(request_id, []).append((stamp, worker.name))
    return {request_id: [name for _, name in sorted(by)] for request_id, by in seen.items()}
