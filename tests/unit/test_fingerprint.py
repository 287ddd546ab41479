"""The built-in model's log-probabilities as handoff computes them (handoff_vllm.fingerprint):
the reference's top token is the rule's, and every wrong context a migration or a transfer can
hand the engine (tests/perturbing_worker/perturbations.py) moves the top log-probabilities of
the next token by more than the tolerance, so the judge names the token where they depart.
tests/vllm_cpu shows the same on the engine, end to end."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from perturbing_worker.perturbations import perturbations
from test_vllm_cpu import on_cpu
from wrong_contexts import pre_merge_requests

from handoff_vllm import cpu, fingerprint, rule, weights
from handoff_vllm.fingerprint import TOLERANCE, TOP_LOGPROBS

#: Tokens generated before the move: early in a response, and well into it.
CUTS = (8, 300)
#: The rule's token leads every other word by more than this many logits.
MARGIN = 10


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


def test_the_computed_top_token_is_the_rules_by_over_ten_logits(shapes):
    """The margin docs/cases.md gives: the rule's token over the next best word."""
    for (_, api), (context, output) in shapes:
        rows = fingerprint.logprobs(context + output[:399], len(context) - 1)
        assert rows.argmax(-1).tolist() == output[:400], api
        ranked = np.sort(rows, axis=-1)
        assert (ranked[:, -1] - ranked[:, -2]).min() > MARGIN, api


def test_the_pages_figures_are_the_models():
    """What docs/cases.md says of the model, read from its definition."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "cases.md").read_text()
    page = " ".join(page.split())
    held = weights.LAYERS * 2 * weights.KV_HEADS * weights.HEAD_DIM
    figures = [
        f"each of the model's {weights.LAYERS * weights.KV_HEADS} KV heads ({weights.LAYERS} "
        f"layers, {weights.KV_HEADS} KV heads each)",
        f"e^{weights.SINK:g} times any token's share over every distance up to "
        f"{weights.CONTEXT_TOKENS:,} (a fit of the six slowest rotary pairs)",
        f"KV cache ({held:,}: {weights.LAYERS} layers, keys and values, {weights.KV_HEADS} KV "
        f"heads, {weights.HEAD_DIM} dimensions)",
        f"more than {TOLERANCE:.0e}".replace("e-0", "e-") + " from the computation",
        f"by a margin of over {MARGIN} logits",
    ]
    assert len(weights.SINK_PAIRS) == 6 and weights.SINK_PAIRS[-1] == weights.HEAD_DIM // 2 - 1
    for figure in figures:
        assert figure in page, figure


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


#: The longest context a pre-merge case reaches (the race's), and what is compared after a
#: wrong KV cache: the next tokens' top log-probabilities.
LONGEST, AFTER = 4066, 4


@pytest.fixture(scope="module")
def longest():
    """A context of `LONGEST` tokens (the anchor, then seeded words) and its pass."""
    rng = np.random.default_rng(7)
    context = [rule.ANCHOR, *rng.integers(rule.FIRST_OUTPUT, 4096, LONGEST - 1).tolist()]
    return context, fingerprint.forward(tuple(context))


def moved_by(past: fingerprint.Pass, keys, values, following: list[int]) -> float:
    """How far the top log-probabilities after each of `following` move when decoded after
    `past`'s tokens with the KV cache `keys` and `values` instead of its own."""
    true = fingerprint.decoded(past, following)
    wrong = fingerprint.decoded(replace(past, keys=tuple(keys), values=tuple(values)), following)
    top = np.argsort(-true, axis=-1)[:, :TOP_LOGPROBS]
    return float(np.abs(np.take_along_axis(wrong - true, top, -1)).max())


@pytest.mark.parametrize("layer", range(weights.LAYERS))
@pytest.mark.parametrize("head", range(weights.KV_HEADS))
@pytest.mark.parametrize("how", ["another request's", "zeroed"])
def test_one_block_of_any_layer_and_kv_head_moves_the_next_tokens(longest, layer, head, how):
    """The first block of one layer's one KV head, at the longest context: 32 tokens of
    4,066, as a transfer that got that slice wrong would leave them."""
    context, whole = longest
    past = whole.cut(LONGEST - AFTER)
    keys, values = [k.copy() for k in past.keys], [v.copy() for v in past.values]
    block = slice(32, 64)
    for cache in (keys[layer], values[layer]):
        cache[head, block] = 0.0 if how == "zeroed" else np.roll(cache[head], 1000, 0)[block]
    assert moved_by(past, keys, values, context[-AFTER:]) > 3 * TOLERANCE


@pytest.mark.parametrize(
    "name",
    ["the third token replaced", "the third and fifth tokens swapped", "the third token dropped"],
)
def test_a_token_changed_at_the_start_of_the_longest_context_moves_the_next_token(longest, name):
    """4,063 tokens later, the effect has not faded: each token's share of a print head's
    attention is about 1 / (e^SINK + n), not 1 / n."""
    context, whole = longest
    wrong = {
        "the third token replaced": [*context[:2], context[2] + 1, *context[3:]],
        "the third and fifth tokens swapped": [*context[:2], context[4], context[3], context[2],
                                               *context[5:]],
        "the third token dropped": context[:2] + context[3:],
    }[name]  # fmt: skip
    true = fingerprint.log_softmax(fingerprint.head_of(whole.out[-1:], weights.recipe(0)))[0]
    given = fingerprint.logprobs(wrong, len(wrong) - 1)[-1]
    top = np.argsort(-true)[:TOP_LOGPROBS]
    assert np.abs(given[top] - true[top]).max() > 3 * TOLERANCE


def test_a_pass_continued_is_the_pass_computed_whole(longest):
    """What the reference keeps and continues (as an engine decodes from its KV cache) is
    exact: the same as computing the context again from its first token."""
    context, _ = longest
    tokens = tuple(context[:300])
    w = weights.recipe(0)
    kept = fingerprint.continued(fingerprint.continued(None, tokens[:170], w), tokens, w)
    whole = fingerprint.continued(None, tokens, w)
    assert np.allclose(kept.out, whole.out, rtol=0, atol=1e-9)


def test_the_sink_holds_no_value(longest):
    """The anchor takes most of every print head's attention; its value there is 0 in every
    layer (but layer 0's flag dimension, the anchor head's), so no rounding of it can move
    the log-probabilities."""
    _, whole = longest
    for n, head in weights.PRINT_HEADS:
        value = whole.values[n][head // weights.GROUP, 0].copy()
        if (n, head // weights.GROUP) == (0, 0):
            value[0] = 0.0
        assert np.abs(value).max() < 1e-30, (n, head)


def test_a_guided_response_is_judged_under_the_guides_mask(shapes):
    """vLLM returns a guided request's log-probabilities under the guide's mask: the opening
    word certain (0), the rest renormalised over the output words. The judge computes them so:
    the engine's answer passes; the unmasked computation, and a masked word carrying
    probability, fail by name."""
    (_, _), (context, _) = shapes[0]
    output = [cpu.GUIDE_OPENING, *rule.continuation([*context, cpu.GUIDE_OPENING], 20)]
    rows = fingerprint.logprobs(context + output[:-1], len(context) - 1)
    engine = [fingerprint.masked(row, cpu.admitted_by_guide(at)) for at, row in enumerate(rows)]
    answer = tops(np.array(engine))
    answer[0] = {cpu.GUIDE_OPENING: 0.0, **dict.fromkeys(range(6, 10), float("-inf"))}

    def judged(observed):
        return fingerprint.departure(context, output, observed, admitted=cpu.admitted_by_guide)

    assert judged(answer) is None
    assert "at token 1: t5 " in fingerprint.departure(context, output, answer)
    leaked = [dict(top) for top in answer]
    leaked[0][6] = -2.0
    assert judged(leaked) == "t6 carries -2.0 at token 1, which the guide masked"
