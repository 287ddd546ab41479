"""The built-in model's rule (handoff_vllm.rule), the reference every vLLM CPU case is judged
against: a context that went wrong at a migration continues differently within 8 tokens, for
every pre-merge request shape. tests/vllm_cpu/test_model.py shows that the weights compute the
same rule, on the engine and in transformers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_vllm_cpu import on_cpu
from wrong_contexts import WITHIN, perturbed, pre_merge_requests

from handoff.cases import selection
from handoff_vllm import rule


@pytest.fixture(scope="module")
def requests_():
    return pre_merge_requests(on_cpu())


def test_the_reference_is_the_rule_on_the_request_the_engine_gets():
    backend = on_cpu()
    case = next(iter(selection("aggregate", "pre_merge", backend)))
    shape = backend.shape(case)
    expected = rule.continuation(rule.context_of(shape.prompt, case.api), shape.max_tokens)
    assert backend.reference(case.api, shape) == "".join(f" t{t}" for t in expected)
    assert shape.prompt.split()[0] == f"t{rule.ANCHOR}"
    assert all(t >= rule.FIRST_OUTPUT for t in expected)  # never the anchor or a marker


@settings(max_examples=200)
@given(data=st.data())
def test_a_wrong_context_continues_differently_within_8_tokens(requests_, data):
    name, context, output = data.draw(st.sampled_from(requests_))
    api = name.partition("/")[2]
    cut = data.draw(st.integers(1, len(output) - WITHIN))
    at = data.draw(st.integers(0, cut - 1))
    expected = output[cut : cut + WITHIN]
    for how, wrong in perturbed(context, output, cut, at, api):
        assert rule.continuation(context + output[:cut], WITHIN) == expected  # the control
        assert rule.continuation(wrong, WITHIN) != expected, f"{name}, {how}, cut {cut}"


def test_the_successor_maps_never_agree_and_never_stay():
    even, odd = rule.successors(0)
    outputs = range(rule.FIRST_OUTPUT, rule.VOCAB - 1)
    assert sorted(even[x] for x in outputs) == list(outputs)  # permutations of the outputs
    assert sorted(odd[x] for x in outputs) == list(outputs)
    assert all(even[x] != odd[x] and x not in (even[x], odd[x]) for x in range(rule.VOCAB))
    assert rule.successors(1) != rule.successors(0)  # another seed, another model


def test_a_second_anchor_is_refused():
    with pytest.raises(ValueError, match="anchor t1 2 times"):
        rule.continuation([rule.ANCHOR, 200, rule.ANCHOR], 1)


@pytest.mark.parametrize("topology", ["stop", "stop_after", "min_tokens"])
def test_a_stop_string_is_the_references_words_where_planned(topology):
    """The stop cases plan their strings over the reference: a backend that answers none
    cannot run them (a change once dropped the method, and every stop case refused to plan)."""
    backend = on_cpu()
    case = next(iter(selection(topology, "nightly")))
    shape = backend.shape(case)
    words = backend.reference(case.api, shape).split()
    assert backend.stop_text(case.api, shape, 5, 9) == " ".join(words[5:9])
