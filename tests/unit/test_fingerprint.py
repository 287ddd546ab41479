"""The built-in model's log-probabilities as handoff computes them (handoff_vllm.fingerprint):
the reference's top token is the rule's, and every wrong context a migration or a transfer can
hand the engine (tests/perturbing_worker/perturbations.py) moves the top log-probabilities of
the next token by more than the tolerance, so the judge names the token where they depart.
tests/vllm_cpu shows the same on the engine, end to end."""

from __future__ import annotations

import numpy as np
import pytest
from perturbing_worker.perturbations import perturbations
from test_vllm_cpu import on_cpu
from wrong_contexts import pre_merge_requests

from handoff_vllm import fingerprint
from handoff_vllm.fingerprint import TOLERANCE, TOP_LOGPROBS

#: Tokens generated before the move: early in a response, and well into it.
CUTS = (8, 300)


def tops(rows: np.ndarray) -> list[dict[int, float]]:
    """The engine's answer: the top log-probabilities of each row, by token id."""
    best = np.argsort(-rows, axis=-1)[:, :TOP_LOGPROBS]
    return [{int(t): float(row[t]) for t in ids} for row, ids in zip(rows, best, strict=True)]


@pytest.fixture(scope="module")
def shapes():
    """One request of each distinct prompt length and API of the pre-merge selection."""
    found = {}
    for name, context, output in pre_merge_requests(on_cpu()):
        found.setdefault((len(context), name.partition("/")[2]), (context, output))
    return list(found.items())


def test_the_computed_top_token_is_the_rules(shapes):
    for (_, api), (context, output) in shapes:
        rows = fingerprint.logprobs(context + output[:399], len(context) - 1)
        assert rows.argmax(-1).tolist() == output[:400], api


def test_the_reference_itself_passes_and_a_nudge_past_the_tolerance_fails(shapes):
    (_, _), (context, output) = shapes[0]
    exact = tops(fingerprint.logprobs(context + output[:39], len(context) - 1))
    assert fingerprint.departure(context, output, exact) is None
    within = [{t: v + 0.9 * TOLERANCE for t, v in top.items()} for top in exact]
    assert fingerprint.departure(context, output, within) is None
    past = [dict(top) for top in exact]
    token = sorted(past[20], key=past[20].get)[0]
    past[20][token] -= 1.1 * TOLERANCE
    assert "depart from the reference at token 21: " in fingerprint.departure(context, output, past)


def test_more_entries_than_the_reference_has_tokens_depart(shapes):
    (_, _), (context, output) = shapes[0]
    short = output[:3]
    exact = tops(fingerprint.logprobs(context + short, len(context) - 1))
    assert fingerprint.departure(context, short, exact) == (
        "4 tokens carry log-probabilities; the reference has 3"
    )


@pytest.mark.parametrize("cut", CUTS)
def test_every_wrong_context_departs_at_the_first_token_after_the_move(shapes, cut):
    for (length, api), (context, output) in shapes:
        before = tops(fingerprint.logprobs(context + output[: cut - 1], len(context) - 1))
        true = context + output[:cut]
        for name, wrong in perturbations(len(context), cut, api == "chat").items():
            given = wrong(true)
            assert given != true, name
            after = tops(fingerprint.logprobs(given, len(given) - 1))
            found = fingerprint.departure(context, output, before + after)
            assert found is not None, f"{length}-token {api} prompt, {cut} generated: {name}"
            assert f"at token {cut + 1}" in found, (name, found)
