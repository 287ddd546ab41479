"""The sampling cases on Dynamo's vLLM workers, each against handoff's own computation of the
close model (handoff_vllm.sampling): a documented divergence is the strict expected failure of
its topology only by its own reason; a seeded draw re-seeded at the move is named and fails;
a successor not given the request's sampling, or one whose word is wrong, fails plainly."""

from __future__ import annotations

from test_engine import SETTINGS, TIMEOUT_S
from test_wrong_contexts import Perturbing

from handoff.cases import Case
from handoff.policies import NOT_GIVEN, RESUMED_AFRESH, known_defect
from handoff.runner import run_case

FREQUENCY = Case.from_id("worker_failure-chat-stream-tcp", "frequency_penalty")
REPETITION = Case.from_id("worker_failure-completion-stream-nats", "repetition_penalty")
SEEDED = Case.from_id("worker_failure-completion-stream-tcp", "seeded")
DEPARTS = "the migrated text departs from the reference at token "


def verdict_of(backend, case, folder):
    return run_case(backend, case, folder, SETTINGS, TIMEOUT_S).verdict


def perturbing(vllm_cpu, name: str) -> Perturbing:
    backend = Perturbing(name, None, None)
    backend.configure(vllm_cpu.configuration)
    return backend


def test_a_frequency_penalty_counted_from_the_move_is_the_documented_divergence(vllm_cpu, tmp_path):
    verdict = verdict_of(vllm_cpu, FREQUENCY, tmp_path)
    assert verdict.upstream_defect == known_defect(FREQUENCY).describe(), verdict.reasons
    assert [r.split(":")[0] for r in verdict.reasons] == [RESUMED_AFRESH], verdict.reasons


def test_a_seeded_draw_seeded_again_at_the_move_is_named_and_fails(vllm_cpu, tmp_path):
    """No document of Dynamo's says a move re-seeds a draw: handoff's own finding, a strict
    expected failure only by its reason and its witness (`policies.SEEDED_FINDING`)."""
    verdict = verdict_of(vllm_cpu, SEEDED, tmp_path)
    assert verdict.upstream_defect == known_defect(SEEDED).describe(), verdict.reasons
    assert [r.split(":")[0] for r in verdict.reasons] == [RESUMED_AFRESH], verdict.reasons


def test_a_repetition_penalty_survives_a_move(vllm_cpu, tmp_path):
    """Its drain is not run on the CPU (`cpu.SAMPLED_KILLS_ONLY`): a kill moves it."""
    verdict = verdict_of(vllm_cpu, REPETITION, tmp_path)
    assert verdict.passed, verdict.reasons or verdict.unproven
    assert any("which no wrong successor gives" in n for n in verdict.notes), verdict.notes


def test_a_successor_not_given_the_frequency_penalty_is_no_documented_divergence(
    vllm_cpu, tmp_path
):
    """Both wrong successors give the same first token after the move; the text tells them
    apart, and the one not given the penalty is a plain failure, not Dynamo PR 13600's."""
    verdict = verdict_of(perturbing(vllm_cpu, "the sampling dropped"), FREQUENCY, tmp_path)
    assert not verdict.passed and verdict.upstream_defect == "", verdict.reasons
    assert any(r.startswith(f"{NOT_GIVEN}: ") for r in verdict.reasons), verdict.reasons


def test_a_successor_not_given_the_repetition_penalty_fails_by_name(vllm_cpu, tmp_path):
    """vLLM counts a repetition penalty over the prompt too, so the tokens carried keep it and
    the case passes; a re-issued request that lost its sampling does not."""
    verdict = verdict_of(perturbing(vllm_cpu, "the sampling dropped"), REPETITION, tmp_path)
    assert not verdict.passed and verdict.upstream_defect == "", verdict.reasons
    assert any(r.startswith(f"{NOT_GIVEN}: ") for r in verdict.reasons), verdict.reasons


def test_a_wrong_word_where_the_documented_divergence_is_expected_is_a_plain_failure(
    vllm_cpu, tmp_path
):
    """The successor's first word replaced: the text is neither the reference's nor what a
    successor counting its penalties from the move gives, so the defect does not explain it."""
    verdict = verdict_of(perturbing(vllm_cpu, "the first token replaced"), FREQUENCY, tmp_path)
    assert not verdict.passed and verdict.upstream_defect == "", verdict.reasons
    assert any(r.startswith(DEPARTS) for r in verdict.reasons), verdict.reasons
