"""The built-in model computed by handoff, in float64 numpy from handoff_vllm.weights: the
log-probability of every word after every position of a context. The engine returns the top
`TOP_LOGPROBS` of each token it generates; their values depend on every token of the context
the engine attended to, in order, and on every value of the KV cache it attended to
(weights.py says how), so comparing them with this computation tells whether the engine
continued the true context: a token replaced, dropped, repeated, swapped or moved anywhere,
another request's prompt, or KV of another layer, head, block or request, moves them by more
than `TOLERANCE` (benchmarks/kv_search.py measures by how much).

The model is run as an engine runs it: each layer's keys and values kept (`Pass`), a context
that shares a beginning with one computed before continuing from it, so a judge or a sampler
that asks after every token pays for one token each time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from handoff_vllm import weights
from handoff_vllm.tiny_model import TOP_LOGPROBS
from handoff_vllm.weights import GROUP, HEAD_DIM, HEADS, RMS_EPS

#: How far the engine's log-probabilities may be from this computation: over ten times the largest
#: difference benchmarks/model_margin.py measured between vLLM's CPU engine and it, on either
#: model (benchmarks/RESULTS.md).
TOLERANCE = 1e-3
#: How many computed contexts are kept to continue from, per model.
KEPT = 6
#: Query rows computed at once (bounds the memory of one score matrix).
ROWS = 1024


@dataclass(frozen=True)
class Pass:
    """The model run over `tokens`: each layer's keys (rotated) and values, (KV head, position,
    dimension), as an engine's KV cache holds them, and the residual stream after the last
    layer."""

    tokens: tuple[int, ...]
    keys: tuple[np.ndarray, ...]
    values: tuple[np.ndarray, ...]
    out: np.ndarray

    def cut(self, length: int) -> Pass:
        """This pass over its first `length` tokens: attention is causal, so it is exact."""
        return Pass(
            self.tokens[:length], tuple(k[:, :length] for k in self.keys),
            tuple(v[:, :length] for v in self.values), self.out[:length],
        )  # fmt: skip


def rms(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + RMS_EPS)


def rotated(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Llama's rotary embedding of queries or keys (..., position, 64), pairs i and i + 32, at
    the angles the engine turns them by (`angles`)."""
    half = HEAD_DIM // 2
    angle = angles(positions)
    cos, sin = np.cos(angle), np.sin(angle)
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def angles(positions: np.ndarray) -> np.ndarray:
    """Each rotary pair's angle at `positions`, in float32 as vLLM computes its table: the
    position divided by the linear scaling factor, times the pair's inverse frequency (the
    power in float64, rounded). The print heads read every pair, so the last bits of a fast
    pair's angle at a far position move the log-probabilities by more than the tolerance:
    computed exactly, the model would not be the engine's."""
    exponents = np.arange(0, HEAD_DIM, 2, dtype=np.float32) / np.float32(HEAD_DIM)
    inverse = np.float32(1.0) / (weights.ROPE_THETA ** exponents.astype(np.float64)).astype(
        np.float32
    )
    scaled = positions.astype(np.float32) / np.float32(weights.ROPE_FACTOR)
    return (scaled[:, None] * inverse[None]).astype(np.float64)


def by_head(x: np.ndarray) -> np.ndarray:
    """(position, heads * 64) as (head, position, 64)."""
    return x.reshape(len(x), x.shape[1] // HEAD_DIM, HEAD_DIM).transpose(1, 0, 2)


def attended(
    h: np.ndarray, layer: weights.Layer, keys: np.ndarray, values: np.ndarray, positions: np.ndarray
) -> np.ndarray:
    """What `layer`'s attention writes at `positions` (each query over every key up to its
    own position), computed only for the query heads whose output is not zero."""
    written = np.zeros((len(h), layer.o.shape[0]))
    for head in range(HEADS):
        cols = weights.rows(head)
        if not layer.o[:, cols].any():
            continue
        q = rotated(h @ layer.q[cols].T.astype(np.float64), positions)
        k, v = keys[head // GROUP], values[head // GROUP]
        for at in range(0, len(h), ROWS):
            rows = slice(at, at + ROWS)
            scores = q[rows] @ k.T / np.sqrt(HEAD_DIM)
            scores[np.arange(len(k))[None, :] > positions[rows, None]] = -np.inf
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            shares = scores / scores.sum(-1, keepdims=True)
            written[rows] += (shares @ v) @ layer.o[:, cols].T
    return written


def switched(x: np.ndarray, w: weights.Weights) -> np.ndarray:
    """Layer 0's MLP added (the later layers' write nothing): only its units that write."""
    used = np.flatnonzero(np.abs(w.down).sum(0))
    h = rms(x)
    gate = h @ w.gate[used].T
    return x + (gate / (1 + np.exp(-gate)) * (h @ w.up[used].T)) @ w.down[:, used].T


def continued(past: Pass | None, tokens: tuple[int, ...], w: weights.Weights) -> Pass:
    """`past` (nothing, where None) continued over the rest of `tokens`: the new positions
    attend to its keys and values as they are, as an engine's decode reads its KV cache (a
    changed cache changes what follows, and only that)."""
    start = 0 if past is None else len(past.tokens)
    positions = np.arange(start, len(tokens), dtype=np.float64)
    x = w.embed[np.asarray(tokens[start:], dtype=np.int64)].astype(np.float64)
    keys, values = [], []
    for n, layer in enumerate(w.layers):
        h = rms(x)
        k = rotated(by_head(h @ layer.k.T.astype(np.float64)), positions)
        v = by_head(h @ layer.v.T.astype(np.float64))
        if past is not None:
            k = np.concatenate([past.keys[n], k], axis=1)
            v = np.concatenate([past.values[n], v], axis=1)
        keys.append(k)
        values.append(v)
        x = x + attended(h, layer, k, v, positions)
        if n == 0:
            x = switched(x, w)
    out = x if past is None else np.concatenate([past.out, x])
    return Pass(tuple(tokens), tuple(keys), tuple(values), out)


_passes: dict[tuple[int, weights.Flavour], list[Pass]] = {}


def forward(
    tokens: tuple[int, ...], seed: int = 0, flavour: weights.Flavour = weights.EXACT
) -> Pass:
    """The pass over `tokens`, continued from the kept pass that shares the longest beginning
    with them."""
    kept = _passes.setdefault((seed, flavour), [])
    ids = np.asarray(tokens, dtype=np.int64)
    best, shared = None, 0
    for p in kept:
        n = min(len(p.tokens), len(ids))
        differ = np.flatnonzero(np.asarray(p.tokens[:n], dtype=np.int64) != ids[:n])
        common = int(differ[0]) if len(differ) else n
        if common > shared:
            best, shared = p, common
    if best is not None and shared == len(tokens):
        return best if len(best.tokens) == shared else best.cut(shared)
    made = continued(
        best.cut(shared) if best is not None else None, tokens, weights.recipe(seed, flavour)
    )
    kept.append(made)
    del kept[:-KEPT]
    return made


def logits(
    tokens: list[int], start: int, seed: int = 0, flavour: weights.Flavour = weights.EXACT
) -> np.ndarray:
    """The raw logit of every word after each position from `start` on, in float64: row i
    scores the token at `start + i + 1` (what an engine's penalties act on)."""
    return head_of(forward(tuple(tokens), seed, flavour).out[start:], weights.recipe(seed, flavour))


def decoded(
    past: Pass, following: list[int], seed: int = 0, flavour: weights.Flavour = weights.EXACT
) -> np.ndarray:
    """The log-probabilities after each of `following`, decoded after `past` with its KV cache
    as it stands (a changed cache: what a decode worker that received it would read)."""
    w = weights.recipe(seed, flavour)
    made = continued(past, (*past.tokens, *following), w)
    return log_softmax(head_of(made.out[-len(following) :], w))


def head_of(out: np.ndarray, w: weights.Weights) -> np.ndarray:
    """The output head's logits of residual-stream rows."""
    return rms(out) @ w.lm_head.T.astype(np.float64)


def log_softmax(rows: np.ndarray) -> np.ndarray:
    top = rows.max(-1, keepdims=True)
    return rows - top - np.log(np.exp(rows - top).sum(-1, keepdims=True))


def logprobs(
    tokens: list[int], start: int, seed: int = 0, flavour: weights.Flavour = weights.EXACT
) -> np.ndarray:
    """The log-probability of every word after each position from `start` on, in float64:
    row i is the distribution of the token at `start + i + 1`."""
    return log_softmax(logits(tokens, start, seed, flavour))


@lru_cache(maxsize=4)
def reference(
    tokens: tuple[int, ...], start: int, flavour: weights.Flavour = weights.EXACT
) -> np.ndarray:
    """`logprobs` of an undisturbed context, kept: a judge compares many observations (every
    wrong context of tests/unit/test_fingerprint.py) with the same one."""
    rows = logprobs(list(tokens), start, flavour=flavour)
    rows.flags.writeable = False
    return rows


#: A received log-probability at or below this carries no probability (a word a guide masked).
NONE_LEFT = -1e3


def departure(
    context: list[int],
    output: list[int],
    observed: list[dict[int, float]],
    flavour: weights.Flavour = weights.EXACT,
    owed: list[int] | None = None,
    admitted: Callable[[int], np.ndarray] | None = None,
) -> str | None:
    """Where the top log-probabilities `observed` for each token of `output` (generated after
    `context`) first depart from this computation by more than `TOLERANCE`, or leave out a
    word that is in the computed top; None where none does. A word outside the computed top
    is allowed only where `owed` (by default `output`) has it: the drawn one. More entries
    than `output` has tokens depart too (fewer are the response's own count to judge:
    evidence.logprob_problems). Under a guide, the engine returns its log-probabilities over
    the words the guide `admitted` at each token, renormalised: so are the computed ones, and
    a word it masked must carry none."""
    owed = output if owed is None else owed
    if len(observed) > len(output):
        return f"{len(observed)} tokens carry log-probabilities; the reference has {len(output)}"
    expected = reference(tuple(context + output[: len(observed) - 1]), len(context) - 1, flavour)
    for at, (seen, row) in enumerate(zip(observed, expected, strict=True)):
        row = row if admitted is None else masked(row, admitted(at))
        floor = np.sort(row)[-TOP_LOGPROBS]
        for token, value in seen.items():
            if row[token] == -np.inf and not (value is None or value <= NONE_LEFT):
                return f"t{token} carries {value} at token {at + 1}, which the guide masked"
            if row[token] != -np.inf and abs(value - row[token]) > TOLERANCE:
                return (
                    f"the log-probabilities depart from the reference at token {at + 1}: "
                    f"t{token} {value:.6f} received, {row[token]:.6f} computed "
                    f"(tolerance {TOLERANCE})"
                )
            drawn = at < len(owed) and token == owed[at]
            if row[token] < floor - TOLERANCE and not drawn:
                return f"t{token} is not among the computed top {TOP_LOGPROBS} at token {at + 1}"
        if len(seen) < min(TOP_LOGPROBS, int(np.isfinite(row).sum())):
            return f"token {at + 1} carries {len(seen)} log-probabilities, {TOP_LOGPROBS} asked"
    return None


def masked(row: np.ndarray, admitted: np.ndarray) -> np.ndarray:
    """`row`'s log-probabilities renormalised over the `admitted` words; -inf elsewhere."""
    kept = np.full_like(row, -np.inf)
    kept[admitted] = log_softmax(row[admitted])
    return kept
