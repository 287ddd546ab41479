"""What the close model (handoff_vllm.weights.CLOSE) outputs under a request's sampling
parameters, computed by handoff from the model's own definition, as vLLM's v1 sampler defines
them: on the raw logits, the repetition penalty over every word of the prompt and the output
(a positive logit divided by it, a negative one multiplied), then the frequency penalty times
each word's count in the output and the presence penalty on each word the output holds; then
the best word, or at a temperature the seeded draw: a torch generator seeded with the
request's seed draws one exponential noise a word each token, and the word whose probability
over its noise is largest is drawn.

With `restart` n, a request moved after n tokens to a successor that began its sampling state
afresh there: those tokens counted as prompt, not output, and its generator seeded again;
with `then` the default sampling, one that was not given the request's sampling at all.
`output` computes the choices; `departure` replays given tokens and finds the first that is
neither the computed choice nor within a close call of it (`fingerprint.TOLERANCE`), which the
engine's float32 arithmetic may take otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from handoff.client import Sampling
from handoff_vllm import fingerprint, weights
from handoff_vllm.fingerprint import TOLERANCE


@dataclass(frozen=True)
class Drawn:
    """A computed output, and how far each choice stood from the next best: in logits for the
    best word, in the log of the ratio for a draw."""

    tokens: tuple[int, ...]
    margins: tuple[float, ...]

    @property
    def least_margin(self) -> float:
        return min(self.margins, default=float("inf"))


def penalised(row: np.ndarray, prompt: list[int], output: list[int], s: Sampling) -> np.ndarray:
    """`row`'s raw logits with vLLM's penalties for a request whose prompt (as its engine was
    given it) is `prompt` and whose output so far is `output`."""
    logits = row.copy()
    if s.repetition_penalty != 1.0:
        seen = np.zeros(len(row), dtype=bool)
        seen[prompt + output] = True
        hit = logits[seen]
        logits[seen] = np.where(hit > 0, hit / s.repetition_penalty, hit * s.repetition_penalty)
    counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=len(row))
    return logits - s.frequency_penalty * counts - s.presence_penalty * (counts > 0)


class Sampler:
    """One request's scores token by token, as vLLM's sampler gives them: `scores` is asked for
    each position in turn, as the engine's generator draws once a token."""

    def __init__(
        self, context: tuple[int, ...], s: Sampling, restart: int | None, then: Sampling | None
    ) -> None:
        self.context, self.s, self.restart, self.then = context, s, restart, then or s
        self.noise = Noise(s.seed) if s.temperature > 0 else None
        self.begins = 0  # the output's first token as the engine counts it

    def scores(self, tokens: list[int]) -> np.ndarray:
        """What decides the token after `tokens` (the output so far): the largest wins."""
        if len(tokens) == self.restart:
            self.s, self.begins = self.then, len(tokens)
            self.noise = Noise(self.s.seed) if self.s.temperature > 0 else None
        whole = [*self.context, *tokens]
        row = fingerprint.logits(whole, len(whole) - 1, flavour=weights.CLOSE)[-1]
        prompt = whole[: len(self.context) + self.begins]
        scores = penalised(row, prompt, tokens[self.begins :], self.s)
        return scores if self.noise is None else self.noise.scores(scores / self.s.temperature)


@lru_cache(maxsize=16)
def output(
    context: tuple[int, ...],
    count: int,
    s: Sampling,
    restart: int | None = None,
    then: Sampling | None = None,
) -> Drawn:
    """The `count` tokens the close model gives after `context` under `s` (moved as `restart`
    and `then` say). Kept: a case plans and judges with the same one."""
    sampler = Sampler(context, s, restart, then)
    tokens: list[int] = []
    margins: list[float] = []
    for _ in range(count):
        scores = sampler.scores(tokens)
        best, second = np.sort(scores)[-2:][::-1]
        margins.append(float(best - second))
        tokens.append(int(np.argmax(scores)))
    return Drawn(tuple(tokens), tuple(margins))


def departure(
    context: tuple[int, ...],
    tokens: tuple[int, ...],
    s: Sampling,
    restart: int | None = None,
    then: Sampling | None = None,
) -> int | None:
    """The first of `tokens` that the request (moved as `restart` and `then` say) would not
    give: neither its computed choice nor within a close call of it; None where each is."""
    sampler = Sampler(context, s, restart, then)
    for at, token in enumerate(tokens):
        scores = sampler.scores(list(tokens[:at]))
        if scores[token] < scores.max() - TOLERANCE:
            return at
    return None


class Noise:
    """A request's seeded generator as vLLM's CPU sampler uses it: one float32 exponential a
    word each token. torch is imported here: only the seeded cases' planning needs it, and it
    is installed where vLLM is."""

    def __init__(self, seed: int) -> None:
        import torch

        self.torch = torch
        self.generator = torch.Generator().manual_seed(seed)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """The log of each word's probability over its noise: the draw is the largest."""
        torch = self.torch
        probs = torch.from_numpy(logits).to(torch.float32).softmax(-1)
        draws = torch.empty(len(logits), dtype=torch.float32).exponential_(generator=self.generator)
        return (probs.double().log() - draws.double().log()).numpy()
