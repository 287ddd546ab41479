"""How far the built-in vLLM model's verdicts are from numeric noise, on vLLM's CPU engine.

For every distinct pre-merge request shape: the engine decodes the request at temperature 0,
float32 as the workers run it, returning the top log-probabilities of every token
(fingerprint.TOP_LOGPROBS); the tokens must be the rule's (handoff_vllm.rule). Then:
- the difference: the largest gap between a log-probability vLLM returned and handoff's own
  computation of the model (handoff_vllm.fingerprint), which the verdict's tolerance must
  exceed at least tenfold;
- the effect: for each wrong context of tests/perturbing_worker/perturbations.py, made halfway
  through the response, how far the next token's top log-probabilities move (computed by
  handoff); the smallest must exceed the tolerance;
- the margin: the smallest gap between the top token's log-probability and the next one's.

Run with the vLLM CPU session's interpreter:
    .nox/vllm_cpu_pre_merge/bin/python benchmarks/model_margin.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from perturbing_worker.perturbations import perturbations
from wrong_contexts import pre_merge_requests

from handoff.plugins import configured_backend
from handoff_vllm import cpu, fingerprint, tiny_model
from handoff_vllm.fingerprint import TOLERANCE, TOP_LOGPROBS


def smallest_effect(context: list[int], output: list[int], chat: bool) -> tuple[float, str]:
    """The least move of the next token's top log-probabilities over every wrong context made
    halfway through `output`, and which it was."""
    cut = len(output) // 2
    true = context + output[:cut]
    expected = fingerprint.logprobs(true, len(true) - 1)[-1]
    top = np.argsort(-expected)[:TOP_LOGPROBS]
    effects = {}
    for name, wrong in perturbations(len(context), cut, chat).items():
        given = wrong(true)
        effects[name] = float(
            np.abs(fingerprint.logprobs(given, len(given) - 1)[-1][top] - expected[top]).max()
        )
    least = min(effects, key=effects.get)
    return effects[least], least


def main() -> None:
    os.environ.update(cpu.ENV)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    backend = configured_backend("vllm", {"device": ("cpu", "benchmark")})
    engine = LLM(
        model=str(tiny_model.ensure()), dtype="float32", enforce_eager=True,
        max_model_len=cpu.CONTEXT_TOKENS, max_num_seqs=1, block_size=cpu.BLOCK_TOKENS,
        enable_prefix_caching=False, distributed_executor_backend="uni",
    )  # fmt: skip
    print(f"{'request':<22}{'tokens':>7}{'tok/s':>7}{'margin':>8}{'|vllm-ref|':>12}"
          f"{'least effect':>14}  wrong context")  # fmt: skip
    widest, least, smallest = 0.0, float("inf"), float("inf")
    for name, context, reference in pre_merge_requests(backend):
        asked = SamplingParams(
            temperature=0, max_tokens=len(reference), ignore_eos=True, logprobs=TOP_LOGPROBS
        )
        started = time.monotonic()
        out = engine.generate(TokensPrompt(prompt_token_ids=context), asked)[0].outputs[0]
        rate = len(reference) / (time.monotonic() - started)
        assert list(out.token_ids) == reference, f"{name}: vLLM departs from the rule"
        computed = fingerprint.logprobs(context + reference[:-1], len(context) - 1)
        gaps = [
            abs(lp.logprob - row[t])
            for step, row in zip(out.logprobs, computed, strict=True)
            for t, lp in step.items()
        ]
        ranked = np.sort(computed, axis=-1)
        margin = float((ranked[:, -1] - ranked[:, -2]).min())
        effect, how = smallest_effect(context, reference, name.endswith("chat"))
        widest, least, smallest = max(widest, *gaps), min(least, effect), min(smallest, margin)
        print(f"{name:<22}{len(reference):>7}{rate:>7.0f}{margin:>8.2f}{max(gaps):>12.2e}"
              f"{effect:>14.2e}  {how}")  # fmt: skip
    print(
        f"largest |vLLM - reference| {widest:.2e}: tolerance {TOLERANCE:.1e} is "
        f"{TOLERANCE / widest:.1f}x it; least effect of a wrong context {least:.2e}: "
        f"{least / TOLERANCE:.1f}x the tolerance; smallest top-1 margin {smallest:.2f}"
    )
    print(f"model: {tiny_model.ensure().name}")


if __name__ == "__main__":
    main()
