"""The built-in model's weights compute its rule (handoff_vllm.rule) and the log-probabilities
handoff computes (handoff_vllm.fingerprint), run by transformers, an implementation that is
neither vLLM nor handoff: on every pre-merge request shape, and on the contexts a migration can
get wrong. A context that lost its prompt or one generated token is
what Dynamo's frontend cannot be made to send on purpose, so it is shown here, offline: the
weights continue it differently, and the verdict's continuity check fails it against the
reference, naming the token."""

from __future__ import annotations

import pytest
from wrong_contexts import WITHIN, perturbed, pre_merge_requests

from handoff import continuity, word_tokenizer
from handoff.client import Chunk, Response
from handoff_vllm import fingerprint, rule, tiny_model
from handoff_vllm.weights import CONTEXT_TOKENS, ROPE_FACTOR, ROPE_THETA


@pytest.fixture(scope="module")
def weights():
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model.ensure(), dtype=torch.float32)
    return model.eval()


def greedy(model, context: list[int], count: int) -> list[int]:
    import torch

    out, ids, past = [], torch.tensor([context]), None
    with torch.no_grad():
        for _ in range(count):
            step = model(ids, past_key_values=past, use_cache=True)
            past, token = step.past_key_values, int(step.logits[0, -1].argmax())
            out.append(token)
            ids = torch.tensor([[token]])
    return out


@pytest.fixture(scope="module")
def requests_(vllm_cpu):
    return pre_merge_requests(vllm_cpu)


def as_stream(tokens: list[int]) -> Response:
    """A completed stream of these tokens, a word a frame, as the client would read it."""
    frames = [Chunk(i, {"id": "x", "choices": [{"text": f" t{t}"}]}) for i, t in enumerate(tokens)]
    frames[-1].data["choices"][0]["finish_reason"] = "length"
    return Response(status=200, chunks=frames, done=True, streamed=True)


def test_the_weights_give_the_rule_on_every_pre_merge_request(weights, requests_):
    for name, context, output in requests_:
        assert greedy(weights, context, 64) == output[:64], name


def transformers_angles(positions):
    """The rotary angles as transformers computes them: the inverse frequency divided by the
    linear factor first, then times the position, in float32 (vLLM divides the position;
    the last bits differ, and the print heads read them)."""
    import torch

    exponents = torch.arange(0, 64, 2, dtype=torch.int64).float() / 64
    inverse = (1.0 / (ROPE_THETA**exponents)).float() / ROPE_FACTOR
    return (torch.tensor(positions, dtype=torch.float32)[:, None] * inverse[None]).double().numpy()


def test_the_reference_turns_rotary_pairs_by_the_engines_own_angles():
    """Every angle of vLLM's cos/sin table (the one its workers build for this model) is the
    reference's (fingerprint.angles) to float32's last bit."""
    import math

    import numpy as np
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding.linear_scaling_rope import (
        LinearScalingRotaryEmbedding,
    )

    longest = math.ceil(CONTEXT_TOKENS / ROPE_FACTOR)
    with set_current_vllm_config(VllmConfig()):
        table = LinearScalingRotaryEmbedding(
            64, 64, longest, ROPE_THETA, True, ROPE_FACTOR, torch.float32
        ).cos_sin_cache.numpy()
    angle = fingerprint.angles(np.arange(len(table)))
    assert np.abs(np.cos(angle) - table[:, :32]).max() < 1e-6
    assert np.abs(np.sin(angle) - table[:, 32:]).max() < 1e-6


def test_the_weights_compute_what_handoff_computes_within_a_tenth_of_the_tolerance(
    weights, requests_, monkeypatch
):
    """transformers, float32, on the weights as written, against handoff_vllm.fingerprint
    turning rotary pairs by transformers' angles: the log-probabilities the verdict judges,
    not only the top token."""
    import torch

    monkeypatch.setattr(fingerprint, "angles", transformers_angles)
    monkeypatch.setattr(fingerprint, "_passes", {})  # none computed with the engine's angles

    for name, context, output in requests_:
        tokens = context + output[:255]
        with torch.no_grad():
            logits = weights(torch.tensor([tokens])).logits[0, len(context) - 1 :].double()
        read = torch.log_softmax(logits, -1).numpy()
        computed = fingerprint.logprobs(tokens, len(context) - 1)
        top = computed.argsort(-1)[:, -fingerprint.TOP_LOGPROBS :]
        rows = range(len(top))
        gap = max(abs(read[i, top[i]] - computed[i, top[i]]).max() for i in rows)
        assert gap < fingerprint.TOLERANCE / 10, f"{name}: {gap:.2e}"


def test_a_wrong_context_continues_off_the_reference_and_fails_the_case(weights, requests_):
    for name, context, output in requests_:
        api = name.partition("/")[2]
        for cut in (WITHIN, len(output) - WITHIN):
            expected = output[cut : cut + WITHIN]
            assert greedy(weights, context + output[:cut], WITHIN) == expected, name
            for how, wrong in perturbed(context, output, cut, cut // 2, api):
                got = greedy(weights, wrong, WITHIN)
                if rule.ANCHOR in wrong:  # without its sink, a short context's print overtakes
                    assert got == rule.continuation(wrong, WITHIN), f"{name}, {how}"
                assert got != expected, f"{name}, {how}, cut {cut}"
                first = next(
                    i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b
                )
                reference = "".join(f" t{t}" for t in output[: cut + WITHIN])
                kept = continuity.check(
                    as_stream(output[:cut] + got),
                    cut + WITHIN,
                    word_tokenizer.count,
                    baseline=reference,
                    compared_with="the reference",
                )
                departs = f"departs from the reference at token {cut + first + 1} "
                assert any(departs in p for p in kept.problems), f"{name}, {how}: {kept}"
