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

On the exact model (every case's but the sampling ones', its tokens the rule's) or on the close
one (`--model close`, the sampling cases': its tokens handoff's computation at temperature 0,
each request cut to `CLOSE_TOKENS`). Run with the vLLM CPU session's interpreter:
    .nox/vllm_cpu_tests/bin/python benchmarks/model_margin.py [--model close]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from perturbing_worker.perturbations import perturbations
from wrong_contexts import pre_merge_requests

from handoff.client import DEFAULT_SAMPLING
from handoff.plugins import configured_backend
from handoff_vllm import cpu, fingerprint, sampling, tiny_model, weights
from handoff_vllm.fingerprint import TOLERANCE, TOP_LOGPROBS


def smallest_effect(
    context: list[int], output: list[int], chat: bool, flavour: weights.Flavour
) -> tuple[float, str]:
    """The least move of the next token's top log-probabilities over every wrong context made
    halfway through `output`, and which it was."""
    cut = len(output) // 2
    true = context + output[:cut]
    expected = fingerprint.logprobs(true, len(true) - 1, flavour=flavour)[-1]
    top = np.argsort(-expected)[:TOP_LOGPROBS]
    effects = {}
    for name, wrong in perturbations(len(context), cut, chat).items():
        given = wrong(true)
        effects[name] = float(
            np.abs(
                fingerprint.logprobs(given, len(given) - 1, flavour=flavour)[-1][top]
                - expected[top]
            ).max()
        )
    least = min(effects, key=effects.get)
    return effects[least], least


#: The close model's requests are cut to this many tokens (its cases ask for 64).
CLOSE_TOKENS = 512


def requests_of(backend, flavour: weights.Flavour) -> list[tuple[str, list[int], list[int]]]:
    """Every distinct pre-merge request shape and the tokens `flavour` gives at temperature 0:
    the rule's for the exact model, handoff's computation for the close one."""
    if flavour == weights.EXACT:
        return pre_merge_requests(backend)
    return [
        (
            name,
            context,
            list(sampling.output(tuple(context), CLOSE_TOKENS, DEFAULT_SAMPLING).tokens),
        )
        for name, context, _ in pre_merge_requests(backend)
    ]


def measured(engine, name: str, context: list[int], reference: list[int], flavour) -> tuple:
    """(tokens a second, the smallest top-1 margin, the largest |vLLM - reference|) of one
    request decoded by `engine`."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    asked = SamplingParams(
        temperature=0, max_tokens=len(reference), ignore_eos=True, logprobs=TOP_LOGPROBS
    )
    started = time.monotonic()
    out = engine.generate(TokensPrompt(prompt_token_ids=context), asked)[0].outputs[0]
    rate = len(reference) / (time.monotonic() - started)
    assert list(out.token_ids) == reference, f"{name}: vLLM departs from handoff's computation"
    computed = fingerprint.logprobs(context + reference[:-1], len(context) - 1, flavour=flavour)
    gaps = [
        abs(lp.logprob - row[t])
        for step, row in zip(out.logprobs, computed, strict=True)
        for t, lp in step.items()
    ]
    ranked = np.sort(computed, axis=-1)
    return rate, float((ranked[:, -1] - ranked[:, -2]).min()), max(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(tiny_model.FLAVOURS), default="exact")
    flavour = tiny_model.FLAVOURS[parser.parse_args().model]
    os.environ.update(cpu.ENV)
    from vllm import LLM

    backend = configured_backend("vllm", {"device": ("cpu", "benchmark")})
    engine = LLM(
        model=str(tiny_model.ensure(flavour=flavour)), dtype="float32", enforce_eager=True,
        max_model_len=cpu.CONTEXT_TOKENS, max_num_seqs=1, block_size=cpu.BLOCK_TOKENS,
        enable_prefix_caching=False, distributed_executor_backend="uni",
    )  # fmt: skip
    print(f"{'request':<22}{'tokens':>7}{'tok/s':>7}{'margin':>8}{'|vllm-ref|':>12}"
          f"{'least effect':>14}  wrong context")  # fmt: skip
    widest, least, smallest = 0.0, float("inf"), float("inf")
    for name, context, reference in requests_of(backend, flavour):
        rate, margin, gap = measured(engine, name, context, reference, flavour)
        effect, how = smallest_effect(context, reference, name.endswith("chat"), flavour)
        widest, least, smallest = max(widest, gap), min(least, effect), min(smallest, margin)
        print(f"{name:<22}{len(reference):>7}{rate:>7.0f}{margin:>8.2f}{gap:>12.2e}"
              f"{effect:>14.2e}  {how}")  # fmt: skip
    print(
        f"{flavour.name} model: largest |vLLM - reference| {widest:.2e}: tolerance "
        f"{TOLERANCE:.1e} is {TOLERANCE / widest:.1f}x it; least effect of a wrong context "
        f"{least:.2e}: {least / TOLERANCE:.1f}x the tolerance; smallest top-1 margin "
        f"{smallest:.2f}"
    )
    print(f"model: {tiny_model.ensure(flavour=flavour).name}")


if __name__ == "__main__":
    main()
