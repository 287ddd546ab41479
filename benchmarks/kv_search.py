"""How much of the built-in vLLM model's KV cache, and of its context, moves what it outputs:
a search over the contexts the cases reach, computed by handoff (handoff_vllm.fingerprint).

- The share: for each of the values a token holds in the KV cache (every layer, key and value,
  KV head, dimension), a block of 32 tokens at the longest context a case reaches has that
  value moved by one (the scale of the values the model holds), and the next token's top
  log-probabilities are computed from the changed cache, as a decode worker would read it. A
  value can move the output when they move by more than the tolerance.
- The search: seeded draws, each a pre-merge request shape, a point in its output (a move's
  cut), and a wrong context or wrong KV at a random position and length before it: a token
  replaced, dropped, duplicated; two runs swapped; a run moved; a span of another request's
  prompt; a block of the KV cache from another request, from another block, from another
  layer or from the other KV head. The effect is how far the next token's top
  log-probabilities move; the smallest over the draws is printed against the tolerance.

Run with any interpreter that has handoff and its vLLM backend (numpy only, no engine):
    .nox/vllm_cpu_tests/bin/python benchmarks/kv_search.py [--draws N] [--seed S]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from wrong_contexts import pre_merge_requests

from handoff.plugins import configured_backend
from handoff_vllm import fingerprint, weights
from handoff_vllm.fingerprint import TOLERANCE, TOP_LOGPROBS, Pass

BLOCK = 32
FIRST_WORD, WORDS = 100, 4096


#: The tokens after a wrong KV cache whose log-probabilities are compared.
AFTER = 4


def effect(true: np.ndarray, rows: np.ndarray) -> float:
    """How far the computed top log-probabilities of each row of `true` move in `rows`, at
    most."""
    top = np.argsort(-true, axis=-1)[:, :TOP_LOGPROBS]
    return float(np.abs(np.take_along_axis(rows - true, top, -1)).max())


def with_kv(past: Pass, change: Callable[[list[np.ndarray], list[np.ndarray]], None]) -> Pass:
    keys, values = [k.copy() for k in past.keys], [v.copy() for v in past.values]
    change(keys, values)
    return replace(past, keys=tuple(keys), values=tuple(values))


def share(context: list[int], rng: np.random.Generator) -> tuple[float, float, int]:
    """The share of a token's KV values that move the output (see above), the smallest effect
    of one, and how many values a token holds."""
    past = fingerprint.forward(tuple(context[:-AFTER]))
    true = fingerprint.decoded(past, context[-AFTER:])
    at = int(rng.integers(1, len(context) - BLOCK - 1))
    effects = []
    for layer in range(weights.LAYERS):
        for cache in (past.keys[layer], past.values[layer]):
            for head in range(weights.KV_HEADS):
                for dim in range(weights.HEAD_DIM):
                    kept = cache[head, at : at + BLOCK, dim].copy()
                    cache[head, at : at + BLOCK, dim] += 1.0
                    effects.append(effect(true, fingerprint.decoded(past, context[-AFTER:])))
                    cache[head, at : at + BLOCK, dim] = kept
    moving = sum(e > TOLERANCE for e in effects)
    return moving / len(effects), min(effects), len(effects)


def other(token: int) -> int:
    return FIRST_WORD + (token - FIRST_WORD + 457) % (WORDS - FIRST_WORD)


def wrong_context(t: list[int], rng: np.random.Generator) -> tuple[str, list[int]]:
    """A wrong context of `t` drawn at random: its kind, and the tokens."""
    at = int(rng.integers(0, len(t) - 1))
    n = int(min(rng.integers(1, BLOCK + 1), len(t) - 1 - at))
    far = int(rng.integers(1, len(t) - at))  # a distance that stays inside the context
    kinds = {
        "tokens replaced": lambda: t[:at] + [other(x) for x in t[at : at + n]] + t[at + n :],
        "tokens dropped": lambda: t[:at] + t[at + n :],
        "tokens duplicated": lambda: t[: at + n] + t[at:],
        "two tokens swapped": lambda: swap(t, at, at + far),
        "two runs swapped": lambda: (
            t[:at] + t[at + n : at + 2 * n] + t[at : at + n] + t[at + 2 * n :]
        ),
        "a run moved later": lambda: (
            t[:at] + t[at + n : at + n + far] + t[at : at + n] + t[at + n + far :]
        ),
    }
    kind = list(kinds)[int(rng.integers(len(kinds)))]
    given = kinds[kind]()[: len(t) + n]
    return kind, given if given != t else wrong_context(t, rng)[1]


def swap(t: list[int], i: int, j: int) -> list[int]:
    u = list(t)
    u[i], u[j] = u[j], u[i]
    return u


def wrong_kv(past: Pass, elsewhere: Pass, rng: np.random.Generator) -> tuple[str, Pass]:
    """A wrong KV cache of `past`, one block of it: its kind, and the cache."""
    blocks = len(past.tokens) // BLOCK
    b = int(rng.integers(0, blocks)) * BLOCK
    c = (int(rng.integers(1, blocks)) * BLOCK + b) % (blocks * BLOCK)
    here, there = slice(b, b + BLOCK), slice(c, c + BLOCK)
    layer, head = int(rng.integers(weights.LAYERS)), int(rng.integers(weights.KV_HEADS))
    other_layer = (layer + int(rng.integers(1, weights.LAYERS))) % weights.LAYERS

    def from_request(keys, values):
        for n in range(weights.LAYERS):
            keys[n][:, here] = elsewhere.keys[n][:, here]
            values[n][:, here] = elsewhere.values[n][:, here]

    def from_block(keys, values):
        for cache in (*keys, *values):
            cache[:, here] = cache[:, there].copy()

    def from_layer(keys, values):
        for caches in (keys, values):
            caches[layer][:, here] = caches[other_layer][:, here]

    def left_zero(keys, values):
        for caches in (keys, values):
            caches[layer][:, here] = 0.0

    def from_head(keys, values):
        for caches in (keys, values):
            caches[layer][head, here] = caches[layer][1 - head, here]

    kinds = {
        "a block of another request's KV": from_request,
        "a block's KV from another block": from_block,
        "a block of one layer from another layer": from_layer,
        "a block of one layer left zero": left_zero,
        "a block of one KV head from the other": from_head,
    }
    kind = list(kinds)[int(rng.integers(len(kinds)))]
    return kind, with_kv(past, kinds[kind])


def search(draws: int, rng: np.random.Generator) -> dict[str, tuple[float, int, str]]:
    """The smallest effect of each kind over `draws` draws: (effect, draws, where)."""
    w = weights.recipe(0)
    backend = configured_backend("vllm", {"device": ("cpu", "benchmark")})
    shapes = pre_merge_requests(backend)
    longest = max(len(c) + len(o) for _, c, o in shapes)
    randoms = [0, *rng.integers(FIRST_WORD, WORDS, longest - 1).tolist()]
    elsewhere = fingerprint.continued(None, tuple(randoms), w)
    found: dict[str, tuple[float, int, str]] = {}
    for index, (name, context, output) in enumerate(shapes):
        whole = fingerprint.continued(None, tuple(context + output), w)
        for _ in range(draws * (index + 1) // len(shapes) - draws * index // len(shapes)):
            n = len(context) + int(rng.integers(AFTER, len(output)))
            t = list(whole.tokens[:n])
            if rng.random() < 0.5:
                true = fingerprint.log_softmax(fingerprint.head_of(whole.out[n - 1 : n], w))
                kind, given = wrong_context(t, rng)
                shared = next(
                    (i for i, (a, b) in enumerate(zip(t, given, strict=False)) if a != b), len(t)
                )
                made = fingerprint.continued(whole.cut(shared), tuple(given), w)
                moved = effect(true, fingerprint.log_softmax(fingerprint.head_of(made.out[-1:], w)))
            else:
                true = fingerprint.log_softmax(fingerprint.head_of(whole.out[n - AFTER : n], w))
                kind, past = wrong_kv(whole.cut(n - AFTER), elsewhere, rng)
                moved = effect(true, fingerprint.decoded(past, t[-AFTER:]))
            least, count, where = found.get(kind, (np.inf, 0, ""))
            if moved < least:
                least, where = moved, f"{name}, {n} tokens"
            found[kind] = (least, count + 1, where)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    backend = configured_backend("vllm", {"device": ("cpu", "benchmark")})
    _, context, output = max(pre_merge_requests(backend), key=lambda s: len(s[1]) + len(s[2]))
    started = time.monotonic()
    moving, least, held = share(context + output, rng)
    print(f"share of a token's {held} KV values that move the output at {len(context + output)} "
          f"tokens: {moving:.1%}; the least of them {least / TOLERANCE:.1f}x the tolerance "
          f"({time.monotonic() - started:.0f} s)")  # fmt: skip
    started = time.monotonic()
    found = search(args.draws, rng)
    print(f"{'wrong context or KV':<42}{'draws':>6}{'least effect':>14}  where")
    for kind, (least, count, where) in sorted(found.items()):
        print(f"{kind:<42}{count:>6}{least / TOLERANCE:>13.1f}x  {where}")
    smallest = min(least for least, _, _ in found.values())
    print(f"smallest effect over {args.draws} draws (seed {args.seed}): {smallest:.2e}, "
          f"{smallest / TOLERANCE:.1f}x the tolerance {TOLERANCE:.0e} "
          f"({time.monotonic() - started:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
