"""How far the built-in vLLM model's decisions are from numeric noise, on vLLM's CPU engine.

For every distinct pre-merge request shape: the engine decodes the request at temperature 0
with the top-2 log-probabilities of every step (the top-1 margin: log-probabilities differ by
exactly what the logits do), checks the tokens against the rule (handoff_vllm.rule), then
prefills the prompt and the whole output in one batch and reads the same log-probabilities
again (prompt_logprobs): the largest difference between the two readings is how far vLLM's
batched prefill and its token-by-token decode disagree. transformers' margins of the same
steps say how far vLLM is from an independent implementation. The issue's bar: the smallest
margin at least 10 times the largest difference.

Run with the vLLM CPU session's interpreter:
    .nox/vllm_cpu_pre_merge/bin/python benchmarks/model_margin.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from wrong_contexts import pre_merge_requests

from handoff.plugins import configured_backend
from handoff_vllm import cpu, rule, tiny_model


def top2(logprobs: dict) -> dict[int, float]:
    return {token: lp.logprob for token, lp in logprobs.items()}


def margin(values: dict[int, float]) -> float:
    first, second = sorted(values.values(), reverse=True)[:2]
    return first - second


def transformers_margins(folder: Path, context: list[int], output: list[int]) -> list[float]:
    """The top-1 margin of every step of `output` in transformers, float32, in one pass."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([context + output])).logits[0, len(context) - 1 : -1]
    best = logits.topk(2).values
    assert logits.argmax(-1).tolist() == output, "transformers departs from the rule"
    return (best[:, 0] - best[:, 1]).tolist()


def main() -> None:
    os.environ.update(cpu.ENV)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    folder = tiny_model.ensure()
    backend = configured_backend("vllm", {"device": ("cpu", "benchmark")})
    engine = LLM(
        model=str(folder),
        enforce_eager=True,
        max_model_len=cpu.CONTEXT_TOKENS,
        max_num_seqs=1,
        block_size=cpu.BLOCK_TOKENS,
        enable_prefix_caching=False,
        distributed_executor_backend="uni",
    )
    print(f"{'request':<22}{'tokens':>7}{'tok/s':>8}{'min margin':>12}{'hf margin':>11}"
          f"{'|vllm-hf|':>11}{'prefill-decode':>16}")  # fmt: skip
    smallest, widest = float("inf"), 0.0
    for name, context, reference in pre_merge_requests(backend):
        decode = SamplingParams(
            temperature=0, max_tokens=len(reference), ignore_eos=True, logprobs=2
        )
        started = time.monotonic()
        out = engine.generate(TokensPrompt(prompt_token_ids=context), decode)[0].outputs[0]
        rate = len(reference) / (time.monotonic() - started)
        assert list(out.token_ids) == reference, f"{name}: vLLM departs from the rule"
        decoded = [top2(step) for step in out.logprobs]
        prefill = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2)
        batch = TokensPrompt(prompt_token_ids=context + reference)
        read = engine.generate(batch, prefill)[0].prompt_logprobs[len(context) :]
        differences = [
            abs(read[i][token].logprob - lp)
            for i, step in enumerate(decoded)
            for token, lp in step.items()
            if token in read[i]
        ]
        margins = [margin(step) for step in decoded]
        hf = transformers_margins(folder, context, reference)
        apart = max(abs(a - b) for a, b in zip(margins, hf, strict=True))
        smallest, widest = min(smallest, *margins), max(widest, *differences)
        print(f"{name:<22}{len(reference):>7}{rate:>8.0f}{min(margins):>12.4f}{min(hf):>11.4f}"
              f"{apart:>11.4f}{max(differences):>16.3g}")  # fmt: skip
    ratio = "infinite" if widest == 0 else f"{smallest / widest:.3g}x"
    print(f"smallest top-1 margin {smallest:.4f}; largest prefill-vs-decode difference "
          f"{widest:.3g} ({ratio}; log-probabilities as vLLM returns them)")  # fmt: skip
    print(f"rule, recipe: {tiny_model.HEAD}; anchor t{rule.ANCHOR}")


if __name__ == "__main__":
    main()
