"""A mocker worker's own record of the contexts it holds: the KV blocks it stored, each with its
token ids, read back from the worker after the fact.

A mocker worker started with `emit_kv_token_ids` and `--zmq-replay-ports` keeps every KV event
it published and replays them to whoever asks on that port (a ZMQ ROUTER): a DEALER sends an
empty frame and the first sequence number wanted (8 bytes, big-endian); each event comes back
as a frame pair (its sequence number, its msgpack payload: a timestamp, the events, the DP
rank), and an empty payload ends the replay. A `BlockStored` event names the block, its parent
and the token ids the block holds: the prompt's, those of a migrated request's re-issued
context just as the worker received them, then the tokens the worker generated (the mocker's
own ids for them, not the ids it sends out). Nothing needs to listen while the case runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import zmq

from handoff.machine.polling import Deadline

#: How long a worker has to replay what it stored: it answers from memory, at once.
REPLAY_WAIT_S = 5.0


class Unread(Exception):
    """The worker's record could not be read: what it holds is unknown."""


@dataclass(frozen=True)
class Block:
    parent: int | None
    tokens: tuple[int, ...]


def stored_blocks(port: int, deadline: Deadline | None = None) -> dict[int, Block]:
    """Every block the worker replaying on `port` (on loopback) says it stored, by hash."""
    deadline = deadline or Deadline(REPLAY_WAIT_S)
    blocks: dict[int, Block] = {}
    for events in replayed(port, deadline):
        for event in events:
            if isinstance(event, dict) and event.get("type") == "BlockStored":
                blocks.update(split(event))
    return blocks


def replayed(port: int, deadline: Deadline) -> Iterator[list]:
    """The events of each payload the worker replays from its first, until its empty payload."""
    context = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(f"tcp://127.0.0.1:{port}")
        socket.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            if not socket.poll(max(deadline.remaining(), 0.0) * 1000):
                raise Unread(f"the worker on port {port} stopped replaying its KV events")
            payload = socket.recv_multipart()[-1]
            if not payload:
                return
            try:
                decoded = msgspec.msgpack.decode(payload)
            except msgspec.DecodeError as exc:
                raise Unread(f"a KV event of the worker on port {port}: {exc}") from None
            yield decoded[1] if isinstance(decoded, list) and len(decoded) > 1 else []
    finally:
        socket.close()


def split(event: dict) -> dict[int, Block]:
    """The blocks of one `BlockStored` event, each with its share of the token ids, chained."""
    hashes = list(event.get("block_hashes") or [])
    tokens = list(event.get("token_ids") or [])
    size = int(event.get("block_size") or 0)
    if not hashes or not size or len(tokens) != size * len(hashes):
        raise Unread(f"a BlockStored event without a token id for each of its blocks: {event}")
    parent = event.get("parent_block_hash")
    blocks = {}
    for n, block in enumerate(hashes):
        blocks[block] = Block(parent, tuple(tokens[n * size : (n + 1) * size]))
        parent = block
    return blocks


def after_prefix(blocks: dict[int, Block], prefix: list[int]) -> list[int] | None:
    """The token ids that follow `prefix` in the one context the blocks hold that starts with
    it (the longest, where one extends another); None where none does, or two part ways."""
    parents = {block.parent for block in blocks.values()}
    found: list[list[int]] = []
    for leaf in (h for h in blocks if h not in parents):
        tokens = chain(blocks, leaf)
        if tokens is not None and tokens[: len(prefix)] == prefix and len(tokens) > len(prefix):
            found.append(tokens[len(prefix) :])
    if not found:
        return None
    longest = max(found, key=len)
    if any(tail != longest[: len(tail)] for tail in found):
        return None
    return longest


def chain(blocks: dict[int, Block], leaf: int) -> list[int] | None:
    """The token ids from the first block to `leaf`; None where a parent is missing."""
    parts: list[tuple[int, ...]] = []
    at: int | None = leaf
    while at is not None:
        if at not in blocks or len(parts) > len(blocks):
            return None
        parts.append(blocks[at].tokens)
        at = blocks[at].parent
    return [token for part in reversed(parts) for token in part]
