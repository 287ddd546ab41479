"""The trials of a race case (`responses.exercise.exercise`), each trial's verdict given: the
first failure ends them and is judged against the race; a trial not proven proves no absence of
the race, so with none failed the case is not proven rather than "the fix has arrived"."""

import pytest
from test_known_defects import RACED

from handoff.cases import Case
from handoff.errors import MissedAfterFault, MissedWindow
from handoff.history import History
from handoff.policies import KNOWN_RACES, RACE_TRIALS, known_defect
from handoff.responses import exercise, witnesses
from handoff.responses.waits import CaseRun
from handoff.verdict import Verdict

RACE_CASE = Case("migration_enabled", "worker_stall", "chat", "stream", "tcp", "decode_race")
RACED_REASONS = RACED["decode_race/worker_stall-chat-tcp"]


def trials(
    monkeypatch, verdicts: list[Verdict], case: Case = RACE_CASE
) -> tuple[Verdict, list[int]]:
    """The race case's verdict where its trials give `verdicts` in turn (then pass), and the
    variants the trials were run with."""
    variants: list[int] = []

    def judged_once(run: CaseRun) -> Verdict:
        variants.append(run.variant)
        return verdicts[len(variants) - 1] if len(variants) <= len(verdicts) else Verdict(True)

    run = CaseRun(None, case, None, None, History(), variant=7)
    return race(monkeypatch, run, judged_once), variants


class Struck:
    """A trial's workload that struck no worker: the witness is the verdict's own."""

    holder = faulted = None

    def __init__(self, case: Case) -> None:
        self.defect = known_defect(case)


def race(monkeypatch, run: CaseRun, judged_once, struck=Struck) -> Verdict:
    """`exercise.exercise` of `run`, each trial's verdict (or exception) from `judged_once`."""
    monkeypatch.setattr(exercise, "once", lambda _plan, run: (judged_once(run), struck(run.case)))
    return exercise.exercise(run)


def test_the_witness_is_read_about_the_worker_the_failing_trial_struck(monkeypatch):
    """The race's witness is read from the system, about the holder of the trial that failed:
    seen, the case is the known defect; the reasons alone never were."""
    asked = []

    def read(witness, deployment, worker, history):
        asked.append(worker)
        return {witness.key: (True, f"read about {worker}")}

    class StruckHolder(Struck):
        holder = "worker-3-decode"

    monkeypatch.setattr(witnesses, "read", read)
    given = iter([Verdict(True), Verdict(False, list(RACED_REASONS))])
    run = CaseRun(None, RACE_CASE, None, None, History(), 7)
    verdict = race(monkeypatch, run, lambda _run: next(given), StruckHolder)
    assert asked == ["worker-3-decode"]
    assert verdict.upstream_defect == RACE.describe(), verdict.summary()


RACE = KNOWN_RACES["decode_race", "worker_stall"]


def raced(seen: bool | None = True) -> Verdict:
    """A trial that failed with the race's reasons, its witness read as `seen`."""
    return Verdict(False, list(RACED_REASONS), witnessed={RACE.witness.key: (seen, "read")})


def test_the_race_seen_at_a_trial_ends_them_as_the_known_defect(monkeypatch):
    verdict, variants = trials(monkeypatch, [Verdict(True), raced()])
    assert variants == [7, 8]
    assert verdict.upstream_defect == RACE.describe()
    assert "trial 2 of 24 failed" in verdict.notes


def test_another_failure_at_a_trial_is_a_plain_failure(monkeypatch):
    verdict, _ = trials(monkeypatch, [Verdict(False, ["finish_reason 'stop', expected 'length'"])])
    assert not verdict.passed and verdict.upstream_defect == ""
    assert verdict.reasons == ["finish_reason 'stop', expected 'length'"]


def test_every_trial_passed_says_the_fix_has_arrived(monkeypatch):
    verdict, variants = trials(monkeypatch, [])
    assert len(variants) == RACE_TRIALS["worker_stall"]
    assert not verdict.passed and "the fix has arrived" in verdict.reasons[0]


def test_the_cut_off_workers_race_is_one_trial_its_premise_decides(monkeypatch):
    cut = Case("migration_enabled", "partition", "completion", "stream", "nats", "decode_race")
    verdict, variants = trials(monkeypatch, [], cut)
    assert len(variants) == 1
    assert "1 trial(s) passed" in verdict.notes and "the fix has arrived" in verdict.reasons[0]


@pytest.mark.parametrize("at", [1, RACE_TRIALS["worker_stall"]])
def test_a_trial_not_proven_goes_on_and_leaves_the_case_not_proven(monkeypatch, at):
    given = [Verdict(True)] * (at - 1) + [Verdict(False, unproven=["the boundary is unknown"])]
    verdict, variants = trials(monkeypatch, given)
    assert len(variants) == RACE_TRIALS["worker_stall"]
    assert verdict.outcome == "not proven" and verdict.reasons == []
    assert verdict.unproven == [f"trial {at}: the boundary is unknown"]


def test_the_races_reasons_without_its_witness_are_a_plain_failure(monkeypatch):
    verdict, _ = trials(monkeypatch, [raced(False)])
    assert verdict.outcome == "failed" and verdict.upstream_defect == ""
    assert verdict.reasons[-1].startswith(f"not {RACE.issue}: its witness is not there")


def test_a_trial_whose_fault_was_never_made_goes_on(monkeypatch):
    """A window missed before the fault leaves the deployment as it was: the trials go on, and
    the race seen later is still the defect."""
    given = iter([MissedWindow("the response had ended complete when held"), raced()])

    def judged_once(run: CaseRun) -> Verdict:
        outcome = next(given)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    verdict = race(monkeypatch, CaseRun(None, RACE_CASE, None, None, History(), 7), judged_once)
    assert verdict.upstream_defect == RACE.describe()


def test_a_window_missed_after_the_fault_ends_the_trials(monkeypatch):
    def judged_once(run: CaseRun) -> Verdict:
        raise MissedAfterFault("etcd was back past the lease")

    with pytest.raises(MissedAfterFault):
        race(monkeypatch, CaseRun(None, RACE_CASE, None, None, History(), 7), judged_once)
