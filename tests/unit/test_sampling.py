"""handoff's computation of the close model under a request's sampling (handoff_vllm.sampling):
vLLM's penalties by their definition, on a row whose answer is worked by hand, and what the
close model is for: its output repeats, every penalty the cases send changes it, and a
successor that counts penalties on generated tokens from the move gives another text, while a
repetition penalty, counted over the prompt too, keeps its text across the move. A seeded draw
needs torch: the seeded cases on the engine (tests/vllm_cpu/test_sampling.py) show it
reproduced, as their text before the move is the computed one and after it exactly the
computed re-seeded one."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_vllm_cpu import on_cpu

from handoff.cases import Case
from handoff.client import DEFAULT_SAMPLING, Sampling
from handoff.policies import NOT_GIVEN, RESUMED_AFRESH
from handoff.responses.single import SAMPLED
from handoff.word_tokenizer import prompt
from handoff_vllm import rule, sampling
from handoff_vllm.fingerprint import TOLERANCE

PENALTIES = ("frequency_penalty", "presence_penalty", "repetition_penalty")
CONTEXT = tuple(rule.context_of(f"t{rule.ANCHOR} " + prompt(63, 0), "completion"))
TOKENS = 64


@pytest.mark.parametrize(
    ("penalty", "expected"),
    [
        (Sampling(repetition_penalty=2.0), [1.0, -2.0, 2.0, 0.5, 3.0]),
        (Sampling(frequency_penalty=0.5), [2.0, -1.0, 3.0, 0.5, 3.0]),
        (Sampling(presence_penalty=1.5), [2.0, -1.0, 2.5, -0.5, 3.0]),
    ],
)
def test_the_penalties_are_vllms(penalty, expected):
    """Repetition over prompt and output words (a positive logit divided, a negative one
    multiplied), frequency times the output count, presence once; word 4 is in neither."""
    row = np.array([2.0, -1.0, 4.0, 1.0, 3.0])
    assert sampling.penalised(row, [0, 1], [2, 2, 3], penalty).tolist() == expected


def test_the_close_models_best_words_repeat():
    drawn = sampling.output(CONTEXT, TOKENS, DEFAULT_SAMPLING)
    assert len(set(drawn.tokens)) < TOKENS // 2, drawn.tokens
    assert drawn.least_margin >= TOLERANCE


@pytest.mark.parametrize("name", PENALTIES)
def test_each_penalty_the_cases_send_changes_the_close_models_output(name):
    best = sampling.output(CONTEXT, TOKENS, DEFAULT_SAMPLING).tokens
    assert sampling.output(CONTEXT, TOKENS, SAMPLED[name]).tokens != best


@pytest.mark.parametrize("name", ("frequency_penalty", "presence_penalty"))
def test_a_successor_counting_penalties_from_the_move_gives_another_text(name):
    s = SAMPLED[name]
    reference = sampling.output(CONTEXT, TOKENS, s).tokens
    moved = sampling.output(CONTEXT, TOKENS, s, restart=12).tokens
    assert moved[:12] == reference[:12] and moved != reference


def test_a_repetition_penalty_keeps_its_text_across_the_move_and_not_without_it():
    s = SAMPLED["repetition_penalty"]
    reference = sampling.output(CONTEXT, TOKENS, s).tokens
    assert sampling.output(CONTEXT, TOKENS, s, restart=12).tokens == reference
    dropped = sampling.output(CONTEXT, TOKENS, s, restart=12, then=DEFAULT_SAMPLING).tokens
    assert dropped[:12] == reference[:12] and dropped != reference


@pytest.mark.parametrize("name", PENALTIES)
def test_the_wrong_successors_are_those_the_sampling_can_have(name):
    """One that began afresh is wrong only where the state counts generated tokens apart: a
    repetition penalty is counted over the prompt too, so it is kept by definition."""
    backend = on_cpu()
    case = Case.from_id("worker_failure-completion-stream-tcp", name)
    shape = replace(backend.shape(case), sampling=SAMPLED[name], max_tokens=TOKENS)
    expected = (NOT_GIVEN,) if name == "repetition_penalty" else (RESUMED_AFRESH, NOT_GIVEN)
    assert backend.wrong_successors("completion", shape) == expected


def test_a_replay_finds_the_first_token_no_successor_would_give():
    """Each computed output follows its own sampler, and one other word anywhere departs
    there: the replay the verdict names a wrong successor by."""
    s = SAMPLED["frequency_penalty"]
    moved = sampling.output(CONTEXT, TOKENS, s, 12).tokens
    assert sampling.departure(CONTEXT, moved, s, 12) is None
    kept = sampling.output(CONTEXT, TOKENS, s).tokens
    first = next(at for at, (a, b) in enumerate(zip(moved, kept, strict=True)) if a != b)
    assert sampling.departure(CONTEXT, moved, s) == first
    wrong = (*moved[:30], rule.FIRST_OUTPUT, *moved[31:])
    assert sampling.departure(CONTEXT, wrong, s, 12) == 30
