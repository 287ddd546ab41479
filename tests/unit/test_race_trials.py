"""The trials of a race case (`responses.single.exercise_race`), each trial's verdict given: the
first failure ends them and is judged against the race; a trial not proven proves no absence of
the race, so with none failed the case is not proven rather than "the fix has arrived"."""

from types import SimpleNamespace

import pytest
from test_known_defects import RACED

from handoff.cases import Case
from handoff.history import History
from handoff.policies import KNOWN_RACES, known_defect, known_race
from handoff.responses import single
from handoff.responses.waits import CaseRun
from handoff.verdict import Verdict

RACE_CASE = Case("migration_enabled", "worker_stall", "chat", "stream", "tcp", "decode_race")
RACED_REASONS = RACED["decode_race/worker_stall-chat-tcp"]


PARTITION = Case("migration_enabled", "partition", "completion", "stream", "tcp", "decode")
#: vLLM's on the CPU: a decode worker cut off (`VllmBackend.races`).
CPU_RACES = {("decode", "partition"): "prefill_same_id"}


def trials(
    monkeypatch, verdicts: list[Verdict], case: Case = RACE_CASE, races=None
) -> tuple[Verdict, list[int]]:
    """The race case's verdict where its trials give `verdicts` in turn (then pass), and the
    variants the trials were run with; `races`: the backend's (`Backend.races`)."""
    variants: list[int] = []

    def judged_once(run: CaseRun) -> Verdict:
        variants.append(run.variant)
        return verdicts[len(variants) - 1] if len(variants) <= len(verdicts) else Verdict(True)

    monkeypatch.setattr(single, "judged_once", judged_once)
    deployment = SimpleNamespace(backend=SimpleNamespace(races=races or {}))
    run = CaseRun(deployment, case, None, None, History(), variant=7)
    return single.exercise_race(run), variants


def test_the_race_seen_at_a_trial_ends_them_as_the_known_defect(monkeypatch):
    verdict, variants = trials(monkeypatch, [Verdict(True), Verdict(False, list(RACED_REASONS))])
    assert variants == [7, 8]
    assert verdict.upstream_defect == KNOWN_RACES["decode_race"].describe()
    assert "trial 2 of 24 failed" in verdict.notes


def test_another_failure_at_a_trial_is_a_plain_failure(monkeypatch):
    verdict, _ = trials(monkeypatch, [Verdict(False, ["finish_reason 'stop', expected 'length'"])])
    assert not verdict.passed and verdict.upstream_defect == ""
    assert verdict.reasons == ["finish_reason 'stop', expected 'length'"]


def test_every_trial_passed_says_the_fix_has_arrived(monkeypatch):
    verdict, variants = trials(monkeypatch, [])
    assert len(variants) == single.RACE_TRIALS
    assert not verdict.passed and "the fix has arrived" in verdict.reasons[0]


@pytest.mark.parametrize("at", [1, single.RACE_TRIALS])
def test_a_trial_not_proven_goes_on_and_leaves_the_case_not_proven(monkeypatch, at):
    given = [Verdict(True)] * (at - 1) + [Verdict(False, unproven=["the boundary is unknown"])]
    verdict, variants = trials(monkeypatch, given)
    assert len(variants) == single.RACE_TRIALS
    assert verdict.outcome == "not proven" and verdict.reasons == []
    assert verdict.unproven == [f"trial {at}: the boundary is unknown"]


def test_a_backends_race_is_its_cases_known_defect_there_only():
    """The decode partition is the race on a backend that names it, a plain case elsewhere."""
    assert known_race(PARTITION, CPU_RACES) is KNOWN_RACES["prefill_same_id"]
    assert known_defect(PARTITION, {}) is None and known_race(PARTITION, {}) is None
    assert known_race(RACE_CASE, {}) is KNOWN_RACES["decode_race"]
    other = Case("migration_enabled", "worker_stall", "completion", "stream", "tcp", "decode")
    assert known_race(other, CPU_RACES) is None


def test_the_prefill_race_seen_at_a_trial_is_its_strict_expected_failure(monkeypatch):
    verdict, _ = trials(monkeypatch, [Verdict(False, list(RACED_REASONS))], PARTITION, CPU_RACES)
    assert verdict.upstream_defect == KNOWN_RACES["prefill_same_id"].describe()
