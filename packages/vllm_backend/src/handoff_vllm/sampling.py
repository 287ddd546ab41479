"""What the close model (handoff_vllm.weights.CLOSE) outputs under a request's sampling
parameters, computed by handoff from the model's own definition, as vLLM's v1 sampler defines
them: on the raw logits, the repetition penalty over every word of the prompt and the output
(a positive logit divided by it, a negative one multiplied), then the frequency penalty times
each word's count in the output and the presence penalty on each word the output holds; then
the best word, or at a temperature the seeded draw: a torch generator seeded with the
request's seed draws one exponential noise a word each token, and the word whose probability
over its noise is largest is drawn.

`output(..., restart=n)` computes what a successor gives that began its sampling state afresh
after the n tokens a move carried: those tokens counted as prompt, not output, and its
generator seeded again; with `then` the default sampling, one that was not given the
request's sampling at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from handoff.client import Sampling
from handoff_vllm import fingerprint, weights


@dataclass(frozen=True)
class Drawn:
    """A computed output, and how far each choice stood from the next best: in logits for the
    best word, in the log of the ratio for a draw. A choice closer than
    `fingerprint.TOLERANCE` is one the engine's float32 arithmetic may take otherwise."""

    tokens: list[int]
    margins: list[float]

    @property
    def least_margin(self) -> float:
        return min(self.margins, default=float("inf"))

    def decided(self, floor: float) -> int:
        """How many tokens come before the first choice closer than `floor`."""
        return next((at for at, m in enumerate(self.margins) if m < floor), len(self.tokens))


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


@lru_cache(maxsize=8)
def output(
    context: tuple[int, ...],
    count: int,
    s: Sampling,
    restart: int | None = None,
    then: Sampling | None = None,
) -> Drawn:
    """The `count` tokens the close model gives after `context` under `s`; with `restart`,
    those of a request moved after `restart` tokens to a successor that began its sampling
    state there, under `then` (`s` by default; the default sampling for a successor that was
    not given the request's). Kept: a case plans, judges and explains with the same one."""
    tokens: list[int] = []
    margins: list[float] = []
    begins = 0  # the output's first token as the engine counts it
    noise = Noise(s.seed) if s.temperature > 0 else None
    for at in range(count):
        if at == restart:
            s = then or s
            noise, begins = Noise(s.seed) if s.temperature > 0 else None, at
        whole = [*context, *tokens]
        row = fingerprint.logits(whole, len(whole) - 1, flavour=weights.CLOSE)[-1]
        scores = penalised(row, whole[: len(context) + begins], tokens[begins:], s)
        if noise is not None:
            scores = noise.scores(scores / s.temperature)
        best, second = np.sort(scores)[-2:][::-1]
        margins.append(float(best - second))
        tokens.append(int(np.argmax(scores)))
    return Drawn(tokens, margins)


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
