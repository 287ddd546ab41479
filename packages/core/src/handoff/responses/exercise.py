"""The one exercise every case goes through (docs/architecture.md): plan, send, hold, inject,
await the end within its bound, check, aftermath, and judge against the known defect by its
witness. A workload (`WORKLOADS`: one request, many at once, a steady load rolled, a client that
leaves) says how each stage is done; the fault's lifecycle (`CaseRun.lifecycle`) is what each
inject, heal and aftermath does; a race repeats the whole."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from handoff.backend import Worker
from handoff.cases import topology
from handoff.errors import MISSED_WINDOW, MissedAfterFault, MissedWindow
from handoff.policies import KnownDefect, race_trials, raced
from handoff.responses import abandon, load, rolling, single, witnesses
from handoff.responses.waits import CaseRun
from handoff.verdict import Verdict, against_known_defect


class Staged(Protocol):
    """One trial of a workload, planned (made from the case's `CaseRun`), stage by stage. A
    context manager: what its stages start (a steady load, a joiner) ends with it."""

    #: The worker the fault struck (a witness is read about it), once `inject` has run.
    holder: Worker | None
    #: The known defect the case runs into on purpose, if any (`policies.known_defect`).
    defect: KnownDefect | None
    #: Where a reason names a request's worker (a load's), the one the fault struck.
    faulted: str | None

    def __enter__(self) -> Staged: ...

    def __exit__(self, *exc: object) -> None: ...

    def send(self) -> None:
        """The request or requests out, the frontend read before them."""

    def hold(self) -> None:
        """The worker that holds them found by its own state, and proven in its window."""

    def inject(self) -> None:
        """The lifecycle's fault, made while the request is provably in its window."""

    def await_end(self) -> None:
        """Every response over within the bound the case's own rates and settings give."""

    def check(self) -> Verdict:
        """Every request with every check: its content, its counters, its evidence."""

    def aftermath(self) -> list[str]:
        """What the fault must leave once every response has ended (`Lifecycle.aftermath`)."""


#: The workloads, by the name a topology gives (`cases.Topology.workload`).
WORKLOADS: dict[str, Callable[[CaseRun], Staged]] = {
    "one": single.One,
    "load": load.Load,
    "rolling": rolling.Rolling,
    "leaves": abandon.Leaving,
}


def exercise(run: CaseRun) -> Verdict:
    """The case's workload through every stage, once, or trial after trial where the case is a
    race (`policies.race_trials`): until one fails (the race showed), or all pass; a trial not
    proven proves no absence of a race, and with none failed the case is then not proven. The
    verdict is then judged against the case's known defect, its witness read first."""
    plan = WORKLOADS[topology(run.case.topology).workload]
    race, trials = raced(run.case), race_trials(run.case)
    unproven: list[str] = []
    for trial in range(1, trials + 1):
        if race:
            run.history.record("trial", number=trial, of=trials)
        try:
            verdict, staged = once(plan, replace(run, variant=run.variant + trial - 1))
        except MissedAfterFault:
            raise
        except MissedWindow as missed:  # no fault was made: the deployment is intact
            if not race:
                raise
            run.history.record("window_missed", reason=str(missed))
            unproven.append(f"trial {trial}: {MISSED_WINDOW}: {missed}")
            continue
        if verdict.reasons:
            if race:
                verdict.notes.append(f"trial {trial} of {trials} failed")
            return judged(verdict, staged, run)
        unproven += [f"trial {trial}: {why}" for why in verdict.unproven]
    if race and unproven:
        return Verdict(False, [], run.history.phase, unproven=unproven)
    if race:
        verdict.notes.append(f"{trials} trial(s) passed")
    return judged(verdict, staged, run)


def once(plan: Callable[[CaseRun], Staged], run: CaseRun) -> tuple[Verdict, Staged]:
    """plan, send, hold, inject, await, check, aftermath."""
    with plan(run) as staged:
        staged.send()
        staged.hold()
        staged.inject()
        staged.await_end()
        verdict = staged.check()
        verdict.reasons += staged.aftermath()
    verdict.passed = not verdict.reasons and not verdict.unproven
    return verdict, staged


def judged(verdict: Verdict, staged: Staged, run: CaseRun) -> Verdict:
    """Against the known defect, proven by its witness about the worker struck."""
    workerless = staged.defect is not None and staged.defect.witness.key in witnesses.WORKERLESS
    if staged.holder is None and not workerless:  # nothing was struck: no witness to read
        return against_known_defect(verdict, staged.defect, staged.faulted)
    return witnesses.judged_against(
        verdict, staged.defect, run.deployment, staged.holder, run.history, staged.faulted
    )
