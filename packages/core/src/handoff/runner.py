"""One case from start to finish: deploy, request, fault, verdict, teardown."""

from __future__ import annotations

import shutil
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import requests

from handoff.backend import Backend
from handoff.cases import Case
from handoff.deployment import Deployment
from handoff.errors import MISSED_WINDOW, CaseFailure, ConnectionCut, HandoffError, MissedWindow
from handoff.history import History
from handoff.machine import start_gate
from handoff.machine.interrupts import interruptible
from handoff.machine.polling import Deadline
from handoff.machine.wallclock import step_reason
from handoff.policies import Policy, policy
from handoff.pool import Pool, Pools
from handoff.responses.exercise import exercise
from handoff.responses.waits import (
    CaseRun,
    Settings,
    fault_env,
    sized_for_queues,
)
from handoff.verdict import FAILED, Verdict, missed_window

#: How long a frontend that stopped answering is given to finish exiting, to tell the two apart.
EXIT_WAIT_S = 1.0


@dataclass
class CaseResult:
    case: Case
    verdict: Verdict
    seconds: float
    folder: Path
    history: History


#: The moments a missed window is told with (`faults.hold`).
WINDOW_MOMENTS = (
    "request_sent", "requests_sent", "holder_found", "in_flight_proven", "requests_placed",
    "fault_sent", "response_finished",
)  # fmt: skip


def run_case(
    backend: Backend,
    case: Case,
    folder: Path,
    settings: Settings,
    timeout_s: float,
    frontend_policy: Policy | None = None,
    roles: tuple[str, ...] | None = None,
    pools: Pools | None = None,
    frontend_env: dict[str, str] | None = None,
) -> CaseResult:
    """Run one case inside `timeout_s`; every process it started is gone when it returns, and
    the workers it drew from `pools` are back there (a failed case discards their pool).
    Without `pools` the case gets a fresh deployment of its own.

    `frontend_policy`, `roles` and `frontend_env` deploy a system other than the case asks for:
    the way tests build a misconfigured system under test and check that the verdict catches it.
    """
    started = time.monotonic()
    history = History()
    deadline = Deadline(timeout_s)
    made = Made()
    interrupted = False
    try:
        # A Ctrl-C that Python swallowed in a finalizer still stops the case at its next wait.
        with interruptible():
            verdict = deploy_and_exercise(
                made, backend, case, folder, settings, deadline, history,
                frontend_policy, roles, pools, frontend_env,
            )  # fmt: skip
    except KeyboardInterrupt as exc:
        # Ctrl-C or SIGTERM: the run stops here, after the teardown below. The history says
        # where the case was, and the logs are kept.
        history.record("interrupted", after=history.phase, how=str(exc) or "KeyboardInterrupt")
        interrupted = True
        raise
    except Exception as exc:
        verdict = ended_by(exc, made.deployment, history)
    finally:
        problems = teardown(made.deployment, history)
        if interrupted:
            history.write(folder / "history.json")
    if missed_window(verdict.reasons, verdict.unproven):
        # The harness was late, not the system: told with the timeline it was late in.
        verdict.unproven[0] += f" ({history.moments(WINDOW_MOMENTS)})"
    if problems:
        verdict = Verdict(
            False, verdict.reasons + problems, verdict.phase, unproven=verdict.unproven
        )
    verdict = unmixed(verdict, made.deployment)
    verdict = concluded(verdict, made, pools, folder, settings, history)
    return CaseResult(case, verdict, time.monotonic() - started, folder, history)


def unmixed(verdict: Verdict, deployment: Deployment | None) -> Verdict:
    """A mixed deployment's case ran processes of two releases, or it proved nothing of the mix
    it exists for: not proven (`releases.mixes`)."""
    pool = deployment.pool if deployment is not None else None
    if pool is None or pool.mix is None or ran_beside(deployment):
        return verdict
    unproven = f"mixed deployment: no process of it ran Dynamo {pool.mix.release} ({pool.mix.how})"
    return replace(verdict, unproven=[*verdict.unproven, unproven])


def ran_beside(deployment: Deployment) -> dict[str, str]:
    """The processes of the case's deployment that ran the mix's other release, replacements
    started in its pool included: name -> release."""
    frontend = [deployment.frontend] if deployment.frontend else []
    return deployment.pool.beside([*deployment.pool.processes, *frontend])


def ended_by(exc: Exception, deployment: Deployment | None, history: History) -> Verdict:
    """The verdict of a case whose exercise raised `exc`, which ends that case alone: the next
    case still runs. When it was found goes in the timeline."""
    phase = history.phase
    if isinstance(exc, MissedWindow):  # the harness was late, not the system: not proven
        history.record("window_missed", reason=str(exc))
        return Verdict(False, [], phase, unproven=[f"{MISSED_WINDOW}: {exc}"])
    if isinstance(exc, requests.RequestException):
        url = exc.request.url if exc.request is not None else None
        said = f"{type(exc).__name__} on {url}"
        return Verdict(False, [unanswered(deployment, url, said)], phase)
    if isinstance(exc, ConnectionCut):  # the frontend's state is the cause to read
        url = deployment.base_url if deployment else ""
        reason = unanswered(deployment, url, str(exc))
    elif isinstance(exc, (CaseFailure, HandoffError)):  # the system failed, or the set-up
        reason = str(exc)
    else:  # a defect, handoff's or a backend's: its pool goes down (its workers may hold it)
        return Verdict(False, [raised(exc)], phase)
    history.record("failure_found", reason=str(exc))
    return Verdict(False, [reason], phase)


@dataclass
class Made:
    """What a case has made so far, for its teardown: its pool, then its deployment."""

    pool: Pool | None = None
    deployment: Deployment | None = None


def deploy_and_exercise(
    made: Made,
    backend: Backend,
    case: Case,
    folder: Path,
    settings: Settings,
    deadline: Deadline,
    history: History,
    frontend_policy: Policy | None,
    roles: tuple[str, ...] | None,
    pools: Pools | None,
    frontend_env: dict[str, str] | None,
) -> Verdict:
    """Draw the case's workers (or start its own), start its frontend, and run the exercise
    (`responses.exercise`)."""
    roles = roles or backend.roles(case.topology)
    settings = sized_for_queues(case, settings, backend)
    env = fault_env(case, settings) if frontend_env is None else frontend_env
    history.record("launch", roles=list(roles), frontend_env=env)
    made.pool = pool = pools.pool_for(backend, case, roles) if pools else None
    made.deployment = deployment = Deployment(
        backend, case, folder, frontend_policy or policy(case.policy), roles, pool, env
    )
    draws_before = deployment.pool.draws
    with start_gate.start_slot(deadline) as waited:
        deployment.start(deadline.within(settings.startup_timeout_s))
    history.record(
        "ready",
        start_slot_wait_s=round(waited, 3),
        pool=pool.name if pool else "fresh",
        cases_before=draws_before,
        workers=[w.name for w in deployment.workers],
        pids={p.name: p.pid for p in deployment.processes},
        ports=deployment.ports,
        beside=ran_beside(deployment),
    )
    return exercise(CaseRun(deployment, case, settings, deadline, history, draws_before))


def concluded(
    verdict: Verdict,
    made: Made,
    pools: Pools | None,
    folder: Path,
    settings: Settings,
    history: History,
) -> Verdict:
    """The verdict once the case is torn down: a wall-clock step fails it (`clock_stepped`);
    a failed case's pool is discarded with its logs kept; a case not proven keeps its pool and
    a copy of its logs; a passed case keeps only its history unless logs are asked for."""
    owner = made.deployment.pool if made.deployment else made.pool
    step = owner.clock.stepped() if owner else None
    if step is not None:
        verdict = clock_stepped(verdict, step, history)
    # A missed window may leave a worker stopped or cut off: its pool goes, as a failure's.
    spoilt = (
        step is not None
        or verdict.outcome == FAILED
        or missed_window(verdict.reasons, verdict.unproven)
    )
    if pools and made.pool and spoilt:
        # Its workers may hold the failure's state: no later case gets them; logs go with it.
        # A known upstream defect is not theirs: its pool goes on, as after a pass, and so
        # does a case not proven (nothing went wrong), whose logs are kept all the same. A pool
        # whose wall clock stepped may have lost its leases: it goes too.
        discarded = pools.discard(made.pool, keep_in=folder)
        history.record("pool_discarded", pool=made.pool.name, problems=discarded)
    elif pools and made.pool and verdict.unproven:
        pools.copy_logs(made.pool, into=folder)
    history.record(
        "verdict", passed=verdict.passed, reasons=verdict.reasons, unproven=verdict.unproven
    )
    history.write(folder / "history.json")
    if verdict.passed and not settings.keep_logs:
        drop_logs(folder)
    return verdict


def clock_stepped(verdict: Verdict, step_s: float, history: History) -> Verdict:
    """A case whose deployment saw the wall clock step: a pass, or a case not proven, keeps
    the step as a note (the evidence it made held); a failure, a known upstream defect's too,
    leads with it and stays failed."""
    history.record("wall_clock_stepped", seconds=step_s)
    if not verdict.reasons:
        verdict.notes.append(step_reason(step_s))
        return verdict
    reasons = [step_reason(step_s), *verdict.reasons]
    return Verdict(False, reasons, verdict.phase, verdict.notes, unproven=verdict.unproven)


def teardown(deployment: Deployment | None, history: History) -> list[str]:
    """Stop what the case started (`Deployment.stop`, which checks that every leased port is
    free again); the problems found. An exception here is one of them: the case fails and its
    pool, discarded, stops the rest."""
    leased: list[int] = []
    problems: list[str] = []
    removed: list[str] = []
    if deployment is not None:
        record_start_up(deployment, history)
        leased = deployment.ports
        try:
            problems = deployment.stop()
        except Exception as exc:
            problems = [raised(exc)]
        removed = deployment.removed
    beside = ran_beside(deployment) if deployment is not None else {}
    history.record("teardown_done", problems=problems, ports=leased, removed=removed, beside=beside)
    return problems


def raised(exc: Exception) -> str:
    """An exception nobody expected, as one reason: its type, the line that raised it (file:
    line) and its message."""
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__} at {where.filename}:{where.lineno}: {exc}"


def unanswered(deployment: Deployment | None, url: str | None, said: str) -> str:
    """A request of the case to `url` got no answer, or its connection broke (`said` how).
    When it went to the frontend, say so, with the frontend's state (exited, stopped, running)
    and its log: that is the cause to read."""
    if deployment is None:
        return said
    frontend = deployment.frontend
    if frontend is None or not url or not url.startswith(deployment.base_url):
        return said
    used_before = frontend.cpu_seconds()
    code = frontend.exit_code_within(EXIT_WAIT_S)  # a killed process may still be dying
    used_after = frontend.cpu_seconds()
    state = f"exited with code {code}" if code is not None else f"is {frontend.state()}"
    if code is None and used_before is not None and used_after is not None:
        # Starved (busy or runnable, but slow) or stalled (asleep, using nothing) read apart.
        state += f", using {(used_after - used_before) / EXIT_WAIT_S:.0%} of a core"
    return (
        f"the frontend stopped answering mid-case ({said}): its process {state}; log "
        f"{frontend.log_path}:\n{frontend.log_tail()}"
    )


def drop_logs(folder: Path) -> None:
    """A passed case keeps only its history (the report draws it); logs and state go."""
    for path in folder.iterdir():
        if path.name == "history.json":
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def record_start_up(deployment: Deployment, history: History) -> None:
    """When each process was launched, and what the frontend listed as they came up."""
    for process in [deployment.warm_up, *deployment.processes]:
        if process is not None and process.started_at is not None:
            history.record_at(
                "process_launched", process.started_at, process=process.name, pid=process.pid
            )
    for when, listed in deployment.listings:
        history.record_at("frontend_listed", when, **listed)
