"""A worker's entries in Dynamo's file discovery store (`DYN_FILE_KV`): found, removed, and
mirrored from a folder of its own into a shared one.

A SIGKILLed worker's entries stay until its lease runs out, about 10 s, and until then every
frontend on that folder lists and may route to the dead instance (measured on Dynamo 1.6.1,
docs/known-issues.md). Layout of the store, as Dynamo 1.6.1 writes it:

- `v1/mdc/<ns>%2F<component>%2F<endpoint>%2F<instance hex>`: the worker's model card, JSON with
  its decimal `instance_id`; the card's files are served from the worker's system port, so the
  card names `127.0.0.1:<system port>/`. That is how a card is tied to a worker handoff started.
- `v1/instances/...%2F<instance hex>`: the endpoints the frontend routes to, one per endpoint
  the worker serves (`generate`, and `worker_kv_query_source_<publisher hex>` where it
  publishes KV events).
- `v1/event_channels/...%2F<publisher hex>` and `v1/event_sources/...`: its KV-event channel.

Dynamo writes an entry as a temporary `.tmp_...` file, then links or renames it into place (a
rewrite is a new inode); its keep-alive touches the file in place; a worker that stops deletes
its own entries; any process on the folder deletes an entry untouched for 10 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from pathlib import Path

KV_QUERY_PREFIX = "worker_kv_query_source_"
#: Dynamo's entries in the making: its watchers and listings skip them.
TEMP_PREFIX = ".tmp_"


def _entries(store: Path, kind: str) -> list[Path]:
    folder = store / "v1" / kind
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def _read(path: Path) -> dict:
    try:
        return parsed(path.read_text())
    except (OSError, ValueError):  # removed, or cut mid-character, between listing and reading
        return {}


def parsed(entry: str | bytes) -> dict:
    """An entry's JSON, or nothing where it is not JSON (half-written)."""
    try:
        return json.loads(entry)
    except ValueError:
        return {}


def _suffix(path: Path) -> str:
    return path.name.rsplit("%2F", 1)[-1]


def served_from(cards: list[dict], endpoints: set[str], system_port: int) -> set[int]:
    """The instance ids of the worker whose system server listens on `system_port`: those of
    the model `cards` it registered whose endpoints are registered too (`endpoints`: the
    instance hex each registered endpoint ends with; a vLLM worker writes its card before its
    endpoints). Empty until then. Shared by every discovery backend (`discovery`). Dynamo 1.6
    names loopback there, 1.5 the machine's address (it has no DYN_SYSTEM_HOST to advertise):
    the port, leased by handoff, tells the worker either way."""
    served = re.compile(rf"//[^/\"]+:{system_port}/")
    return {
        card["instance_id"]
        for card in cards
        if served.search(json.dumps(card))
        and "instance_id" in card
        and f"{card['instance_id']:x}" in endpoints
    }


def instance_ids(store: Path, system_port: int) -> set[int]:
    """`served_from` the file store's cards and endpoints."""
    endpoints = {_suffix(p) for p in _entries(store, "instances")}
    return served_from([_read(p) for p in _entries(store, "mdc")], endpoints, system_port)


def entries_of(store: Path, ids: set[int]) -> list[Path]:
    """Every entry of the worker with instance `ids`: its cards, its endpoints, and the event
    channel of the KV publisher its endpoints name."""
    hexes = {f"{i:x}" for i in ids}
    instances = [p for p in _entries(store, "instances") if _suffix(p) in hexes]
    publishers = {
        endpoint.removeprefix(KV_QUERY_PREFIX)
        for p in instances
        if (endpoint := _read(p).get("endpoint", "")).startswith(KV_QUERY_PREFIX)
    }
    cards = [p for p in _entries(store, "mdc") if _suffix(p) in hexes]
    channels = [
        p
        for kind in ("event_channels", "event_sources")
        for p in _entries(store, kind)
        if _suffix(p) in publishers
    ]
    return cards + instances + channels


def remove(store: Path, ids: set[int]) -> list[str]:
    """Remove a dead worker's entries, so no frontend lists or routes to it; returns them,
    relative to the store."""
    removed = []
    for path in entries_of(store, ids):
        path.unlink(missing_ok=True)
        removed.append(str(path.relative_to(store)))
    return removed


class Mirror:
    """A worker's own discovery folder kept true in a shared store, one `sync` at a time: each
    entry it has, in the store as the same inode (so its keep-alive freshens both), relinked when
    it rewrites one by rename; each it removed, removed from the store. An entry the store's
    expiry removed stays removed, as in a folder the worker shared."""

    def __init__(self, source: Path, store: Path) -> None:
        self.source = source
        self.store = store
        #: Entry (relative to both folders) -> the inode linked into the store for it.
        self.linked: dict[Path, int] = {}

    def sync(self) -> None:
        present = self._entries()
        for entry, inode in present.items():
            if self.linked.get(entry) != inode:  # new, or rewritten by rename
                self._link(entry)
        for entry in self.linked.keys() - present.keys():
            target = self.store / entry
            with contextlib.suppress(FileNotFoundError):
                if target.stat().st_ino == self.linked[entry]:  # not another writer's since
                    target.unlink()
            del self.linked[entry]

    def _entries(self) -> dict[Path, int]:
        entries = {}
        for path in self.source.rglob("*"):
            if path.name.startswith(TEMP_PREFIX):
                continue
            with contextlib.suppress(FileNotFoundError):  # removed since the listing
                info = path.lstat()
                if stat.S_ISREG(info.st_mode):
                    entries[path.relative_to(self.source)] = info.st_ino
        return entries

    def _link(self, entry: Path) -> None:
        """Link the entry into the store through a temporary name, then rename it into place:
        a frontend watching the store reads it whole, as it reads Dynamo's own writes."""
        target = self.store / entry
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f"{TEMP_PREFIX}handoff-{os.getpid()}")
        temp.unlink(missing_ok=True)
        try:
            os.link(self.source / entry, temp)
        except FileNotFoundError:  # removed or renamed since the listing: the next sync sees it
            return
        self.linked[entry] = temp.stat().st_ino
        os.replace(temp, target)
