"""The race of the re-issued request (cases.DECODE_RACE), on Dynamo's vLLM workers: alone it is
the strict expected failure of Dynamo issue 13088; beside a second, real failure (a prefill
worker that hands every decode worker the KV of another prompt, so that the log-probabilities
depart from the first token) it is a plain failure, naming what the race does not explain."""

from __future__ import annotations

from test_engine import SETTINGS
from test_wrong_contexts import Perturbing

from handoff.cases import Case
from handoff.policies import KNOWN_RACES
from handoff.runner import run_case
from handoff_vllm import cpu

RACE = Case.from_id("worker_stall-chat-tcp", "decode_race")
DEFECT = KNOWN_RACES["decode_race"]
TIMEOUT_S = cpu.TIMEOUTS["decode_race"]
DEPARTS = "the log-probabilities depart from the reference at token 1: "


def test_the_race_alone_is_a_strict_expected_failure(vllm_cpu, tmp_path):
    verdict = run_case(vllm_cpu, RACE, tmp_path, SETTINGS, TIMEOUT_S).verdict
    assert not verdict.passed
    assert verdict.upstream_defect == DEFECT.describe(), verdict.reasons
    assert any(n.startswith("trial ") and n.endswith(" failed") for n in verdict.notes)


def test_a_second_failure_beside_the_race_is_a_plain_failure(vllm_cpu, tmp_path):
    wrong_kv = Perturbing("another request's prompt of the same length", "prefill", 0)
    wrong_kv.configure(vllm_cpu.configuration)
    verdict = run_case(wrong_kv, RACE, tmp_path, SETTINGS, TIMEOUT_S).verdict
    assert not verdict.passed and verdict.upstream_defect == "", verdict.reasons
    assert any(r.startswith(DEPARTS) for r in verdict.reasons), verdict.reasons
    if all(any(sign in r for r in verdict.reasons) for sign in DEFECT.signature):
        assert verdict.reasons[-1].startswith(f"not {DEFECT.issue} alone: it does not explain: ")
