"""The races of the re-issued request (cases.DECODE_RACE: a stalled decode worker resumed at the
move, a cut-off one), on Dynamo's vLLM workers: alone each is the strict expected failure of
Dynamo issue 13088; beside a second, real failure (a prefill worker that hands every decode
worker the KV of another prompt, so that the log-probabilities depart from the first token) it
is a plain failure, naming what the race does not explain."""

from __future__ import annotations

import pytest
from test_engine import SETTINGS
from test_wrong_contexts import Perturbing

from handoff.cases import Case
from handoff.policies import known_defect
from handoff.runner import run_case
from handoff_vllm import cpu

RACES = [
    Case.from_id(i, "decode_race") for i in ("worker_stall-chat-tcp", "partition-completion-nats")
]
TIMEOUT_S = cpu.TIMEOUTS["decode_race"]
DEPARTS = "the log-probabilities depart from the reference at token 1: "


@pytest.mark.parametrize("race", RACES, ids=lambda c: c.fault)
def test_the_race_alone_is_a_strict_expected_failure(vllm_cpu, tmp_path, race):
    verdict = run_case(vllm_cpu, race, tmp_path, SETTINGS, TIMEOUT_S).verdict
    assert not verdict.passed
    assert verdict.upstream_defect == known_defect(race).describe(), verdict.reasons
    assert any(n.startswith("trial ") and n.endswith(" failed") for n in verdict.notes)


@pytest.mark.parametrize("race", RACES, ids=lambda c: c.fault)
def test_a_second_failure_beside_the_race_is_a_plain_failure(vllm_cpu, tmp_path, race):
    wrong_kv = Perturbing("another request's prompt of the same length", "prefill", 0)
    wrong_kv.configure(vllm_cpu.configuration)
    verdict = run_case(wrong_kv, race, tmp_path, SETTINGS, TIMEOUT_S).verdict
    defect = known_defect(race)
    assert not verdict.passed and verdict.upstream_defect == "", verdict.reasons
    assert any(r.startswith(DEPARTS) for r in verdict.reasons), verdict.reasons
    if all(any(sign in r for r in verdict.reasons) for sign in defect.signature):
        assert verdict.reasons[-1].startswith(f"not {defect.issue} alone: it does not explain: ")
