"""The built-in model computed by handoff, in float64 numpy from handoff_vllm.weights: the
log-probability of every word after every position of a context. The engine returns the top
`TOP_LOGPROBS` of each token it generates; their values depend on every token of the context
the engine attended to, in order (weights.py says how), so comparing them with this
computation tells whether the engine continued the true context: a token replaced, dropped,
repeated, swapped or moved anywhere, another request's prompt, or another request's KV, moves
them by more than `TOLERANCE`.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from handoff_vllm import tiny_model, weights
from handoff_vllm.tiny_model import TOP_LOGPROBS
from handoff_vllm.weights import HEAD_DIM, HEADS, RMS_EPS, ROPE_THETA

#: How far the engine's log-probabilities may be from this computation: over ten times the largest
#: difference benchmarks/model_margin.py measured between vLLM's CPU engine and it.
TOLERANCE = 7e-4


def rms(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + RMS_EPS)


def rotated(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Llama's rotary embedding of one head's queries or keys (pairs i and i + 32), positions
    divided by the linear scaling factor as vLLM and transformers do."""
    half = HEAD_DIM // 2
    inverse = ROPE_THETA ** (-np.arange(half) / half) / tiny_model.ROPE_FACTOR
    angle = positions[:, None] * inverse[None]
    cos, sin = np.cos(angle), np.sin(angle)
    first, second = x[:, :half], x[:, half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def attention(h: np.ndarray, w: weights.Weights, start: int) -> np.ndarray:
    """Layer 0's attention output at positions `start` on, computed only for the heads whose
    output is not zero (layer 0 reads the embeddings alone: later positions need no earlier
    output)."""
    positions = np.arange(len(h), dtype=np.float64)
    causal = np.arange(len(h))[None, :] > np.arange(start, len(h))[:, None]
    out = np.zeros((len(h) - start, HEADS * HEAD_DIM))
    for head in range(HEADS):
        rows = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)
        if not w.o[:, rows].any():
            continue
        q = rotated(h[start:] @ w.q[rows].T.astype(np.float64), positions[start:])
        k = rotated(h @ w.k[rows].T.astype(np.float64), positions)
        scores = np.where(causal, -np.inf, q @ k.T / np.sqrt(HEAD_DIM))
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, rows] = (scores / scores.sum(-1, keepdims=True)) @ (h @ w.v[rows].T)
    return out


def logits(
    tokens: list[int], start: int, seed: int = 0, flavour: weights.Flavour = weights.EXACT
) -> np.ndarray:
    """The raw logit of every word after each position from `start` on, in float64: row i
    scores the token at `start + i + 1` (what an engine's penalties act on)."""
    w = weights.recipe(seed, flavour)
    embedded = w.embed[np.asarray(tokens)].astype(np.float64)
    x = embedded[start:] + attention(rms(embedded), w, start) @ w.o.T
    used = np.flatnonzero(np.abs(w.down).sum(0))  # the MLP's units that write anything
    h = rms(x)
    gate = h @ w.gate[used].T
    x = x + (gate / (1 + np.exp(-gate)) * (h @ w.up[used].T)) @ w.down[:, used].T
    return rms(x) @ w.lm_head.T.astype(np.float64)


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


def departure(
    context: list[int],
    output: list[int],
    observed: list[dict[int, float]],
    flavour: weights.Flavour = weights.EXACT,
    owed: list[int] | None = None,
) -> str | None:
    """Where the top log-probabilities `observed` for each token of `output` (generated after
    `context`) first depart from this computation by more than `TOLERANCE`, or leave out a
    word that is in the computed top; None where none does. A word outside the computed top
    is allowed only where `owed` (by default `output`) has it: the drawn one. More entries
    than `output` has tokens depart too (fewer are the response's own count to judge:
    evidence.logprob_problems)."""
    owed = output if owed is None else owed
    if len(observed) > len(output):
        return f"{len(observed)} tokens carry log-probabilities; the reference has {len(output)}"
    expected = reference(tuple(context + output[: len(observed) - 1]), len(context) - 1, flavour)
    for at, (seen, row) in enumerate(zip(observed, expected, strict=True)):
        floor = np.sort(row)[-TOP_LOGPROBS]
        for token, value in seen.items():
            if abs(value - row[token]) > TOLERANCE:
                return (
                    f"the log-probabilities depart from the reference at token {at + 1}: "
                    f"t{token} {value:.6f} received, {row[token]:.6f} computed "
                    f"(tolerance {TOLERANCE})"
                )
            drawn = at < len(owed) and token == owed[at]
            if row[token] < floor - TOLERANCE and not drawn:
                return f"t{token} is not among the computed top {TOP_LOGPROBS} at token {at + 1}"
        if len(seen) < TOP_LOGPROBS:
            return f"token {at + 1} carries {len(seen)} log-probabilities, {TOP_LOGPROBS} asked"
    return None
