"""Mocker outputs that name their engine and their place: each token says which worker
generated it and where in that worker's own output it stands.

The mocker draws its tokens at random unless a request carries the annotation
`output_replay_id:<key>` and its worker was started with a response replay trace (a JSONL file,
`response_replay_trace_path`) holding that key's `output_token_ids`: the worker then emits those
tokens in order, from the first, for as many as the trace holds, whatever the request's
`max_tokens` (measured on Dynamo 1.6.1: docs/cases.md as of 708d296). A migrated request's new
worker does the same from its own first token, so its output stops short of the request's
length only where the worker's context is capped (`max_model_len`): capped at the prompt plus
the output, the new worker, given the prompt plus the `k` tokens already sent, emits exactly
the rest.

Worker `n` of a folder replays `BASE + n * PERIOD + i % PERIOD` as its token `i`: ids above the
mocker's own random draws (1000 to 1999) and the prompts' words, below the model's vocabulary.
A token lost or repeated anywhere, or a new worker's first tokens lost, shows as a break in one
worker's sequence; where the new worker's tokens begin is where the worker changes.
"""

from __future__ import annotations

import json
from pathlib import Path

from handoff.sequences import Origin
from handoff.word_tokenizer import WORDS

#: The key of every replayed output: one row per worker's trace.
KEY = "handoff"
ANNOTATION = f"output_replay_id:{KEY}"
BASE = 2000
PERIOD = 256
#: Workers of one folder with outputs of their own; the ninth shares the first's.
ENGINES = (WORDS - BASE) // PERIOD


def write_trace(folder: Path, port: int, length: int) -> Path:
    """The trace of the next worker of `folder` (its system `port` names the file): `length`
    tokens of its own sequence under `KEY`; a port's trace keeps its worker's number (a launch
    made again for a running worker, as a pool checks one)."""
    path = folder / f"output-{port}.jsonl"
    if path.exists():  # its number kept
        engine = first_worker(path)
    else:
        engine = len(list(folder.glob("output-*.jsonl"))) % ENGINES
    tokens = [BASE + engine * PERIOD + i % PERIOD for i in range(length)]
    row = {"request_id": KEY, "output_length": length, "output_token_ids": tokens}
    path.write_text(json.dumps(row) + "\n")
    return path


def first_worker(trace: Path) -> int:
    """The number of the worker whose output `trace` holds."""
    found = origin(json.loads(trace.read_text())["output_token_ids"][0])
    assert found is not None, trace
    return found.worker


def origin(token_id: int) -> Origin | None:
    """The worker of its folder that replayed `token_id` and its place in that worker's output
    (modulo `PERIOD`); None for a token no replayed output holds."""
    if not BASE <= token_id < BASE + ENGINES * PERIOD:
        return None
    return Origin(*divmod(token_id - BASE, PERIOD), PERIOD)
