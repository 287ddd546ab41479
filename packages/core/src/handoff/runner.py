"""One case from start to finish: deploy, request, fault, verdict, teardown."""

from __future__ import annotations

import shutil
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import requests

from handoff import continuity, faults, metrics
from handoff.backend import Backend, Shape, Worker
from handoff.cases import ABANDONS, BROKER, PAST_LEASE, SILENT, Case, topology
from handoff.client import InFlight, Request, Response
from handoff.deployment import Deployment
from handoff.errors import CaseFailure, HandoffError
from handoff.history import History
from handoff.machine.pace import paced, response_bound_s
from handoff.machine.wallclock import step_reason
from handoff.policies import (
    KNOWN_DEFECTS,
    Policy,
    expected_outcome,
    policy,
)
from handoff.polling import Deadline, Timeout, interruptible, poll_until
from handoff.pool import Pools
from handoff.responses import abandon, load, recovery
from handoff.responses.waits import (
    BASELINE,
    CLIENT_GRACE_S,
    RESPONSE_FIXED_S,
    RESPONSE_SLOWER_BY,
    FirstMigration,
    Settings,
    fault_env,
    fault_wait,
    last_token,
    late_counts,
    record_response,
    reference_text,
    settled_counts,
    sized_for_queues,
    undisturbed,
)
from handoff.verdict import (
    FAILED,
    Verdict,
    against_known_defect,
    judge,
    transfer_problems,
)

#: The first token follows the transfer; its counter may lag the token. On two CPU cores shared
#: with vLLM's spinning NIXL threads it lagged by more than 1 s once (benchmarks/RESULTS.md); the
#: bound only costs time when the counter never rises.
TRANSFER_COUNT_WAIT_S = 5.0
#: The choices (`n`) a `choices` case asks for: more than one, which the frontend must not move.
CHOICES = 2
#: How often the frontend's /metrics is read, as a sign of life, while the response runs.
FRONTEND_CHECK_S = 1.0
#: How long a frontend that stopped answering is given to finish exiting, to tell the two apart.
EXIT_WAIT_S = 1.0


@dataclass
class CaseResult:
    case: Case
    verdict: Verdict
    seconds: float
    folder: Path
    history: History


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
    pool = deployment = None
    interrupted = False
    try:
        # A Ctrl-C that Python swallowed in a finalizer still stops the case at its next wait.
        with interruptible():
            roles = roles or backend.roles(case.topology)
            settings = sized_for_queues(case, settings, backend)
            env = fault_env(case, settings) if frontend_env is None else frontend_env
            history.record("launch", roles=list(roles), frontend_env=env)
            pool = pools.pool_for(backend, case, roles) if pools else None
            deployment = Deployment(
                backend, case, folder, frontend_policy or policy(case.policy), roles, pool, env
            )
            draws_before = deployment.pool.draws
            deployment.start(deadline.within(settings.startup_timeout_s))
            history.record(
                "ready",
                pool=pool.name if pool else "fresh",
                cases_before=draws_before,
                workers=[w.name for w in deployment.workers],
                pids={p.name: p.pid for p in deployment.processes},
                ports=deployment.ports,
            )
            exercised = (
                load.exercise_load
                if topology(case.topology).load
                else abandon.exercise_abandon
                if case.fault in ABANDONS
                else exercise
            )
            verdict = exercised(deployment, case, settings, deadline, history, draws_before)
    except (CaseFailure, HandoffError) as exc:
        # The system under test failed or the set-up is wrong: each fails this case with its
        # reason; the next case still runs.
        verdict = Verdict(passed=False, reasons=[str(exc)], phase=history.phase)
    except requests.RequestException as exc:
        verdict = Verdict(False, [unanswered(deployment, exc)], history.phase)
    except Exception as exc:
        # A defect, handoff's or a backend's: it fails this case, by its line, and takes the
        # pool down (its workers may hold the request); the next case still runs.
        verdict = Verdict(False, [raised(exc)], history.phase)
    except KeyboardInterrupt as exc:
        # Ctrl-C or SIGTERM: the run stops here, after the teardown below. The history says
        # where the case was, and the logs are kept.
        history.record("interrupted", after=history.phase, how=str(exc) or "KeyboardInterrupt")
        interrupted = True
        raise
    finally:
        problems = teardown(deployment, history)
        if interrupted:
            history.write(folder / "history.json")
    if problems:
        verdict = Verdict(
            False, verdict.reasons + problems, verdict.phase, unproven=verdict.unproven
        )
    owner = deployment.pool if deployment else pool
    step = owner.clock.stepped() if owner else None
    if step is not None:
        verdict = clock_stepped(verdict, step, history)
    spoilt = step is not None or verdict.outcome == FAILED
    if pools and pool and spoilt:
        # Its workers may hold the failure's state: no later case gets them; logs go with it.
        # A known upstream defect is not theirs: its pool goes on, as after a pass, and so
        # does a case not proven (nothing went wrong), whose logs are kept all the same. A pool
        # whose wall clock stepped may have lost its leases: it goes too.
        discarded = pools.discard(pool, keep_in=folder)
        history.record("pool_discarded", pool=pool.name, problems=discarded)
    elif pools and pool and verdict.unproven:
        pools.copy_logs(pool, into=folder)
    history.record(
        "verdict", passed=verdict.passed, reasons=verdict.reasons, unproven=verdict.unproven
    )
    history.write(folder / "history.json")
    if verdict.passed and not settings.keep_logs:
        drop_logs(folder)
    return CaseResult(case, verdict, time.monotonic() - started, folder, history)


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
    history.record("teardown_done", problems=problems, ports=leased, removed=removed)
    return problems


def raised(exc: Exception) -> str:
    """An exception nobody expected, as one reason: its type, the line that raised it (file:
    line) and its message."""
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__} at {where.filename}:{where.lineno}: {exc}"


def unanswered(deployment: Deployment, exc: requests.RequestException) -> str:
    """A request of the case got no answer. When it went to the frontend, say so, with the
    frontend's state (exited, stopped, running) and its log: that is the cause to read."""
    url = exc.request.url if exc.request is not None else None
    frontend = deployment.frontend
    if frontend is None or not url or not url.startswith(deployment.base_url):
        return str(exc)
    used_before = frontend.cpu_seconds()
    code = frontend.exit_code_within(EXIT_WAIT_S)  # a killed process may still be dying
    used_after = frontend.cpu_seconds()
    state = f"exited with code {code}" if code is not None else f"is {frontend.state()}"
    if code is None and used_before is not None and used_after is not None:
        # Starved (busy or runnable, but slow) or stalled (asleep, using nothing) read apart.
        state += f", using {(used_after - used_before) / EXIT_WAIT_S:.0%} of a core"
    return (
        f"the frontend stopped answering mid-case ({type(exc).__name__} on {url}): its "
        f"process {state}; log {frontend.log_path}:\n{frontend.log_tail()}"
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


def exercise(
    deployment: Deployment,
    case: Case,
    settings: Settings,
    deadline: Deadline,
    history: History,
    variant: int = 0,
) -> Verdict:
    """Send the request, fault the worker that holds it in its window, and judge the outcome.
    `variant` picks the prompt: a pool's cases each get their own, so none finds another's
    prefix in a worker's cache."""
    backend, where = deployment.backend, topology(case.topology)
    assert deployment.model is not None
    metrics_url, model = deployment.base_url + "/metrics", deployment.model.name
    shape = backend.shape(case, variant)
    if where.request == "guided":
        shape = replace(shape, guide=backend.guide(case.api))
    stream = case.response == "stream"
    request = Request(
        case.api,
        stream,
        model,
        shape.prompt,
        shape.max_tokens,
        guide=shape.guide,
        choices=CHOICES if where.request == "choices" else 1,
    )
    pace = None
    if (seconds := backend.output_seconds(case)) is not None:
        pace, shape = paced(
            deployment.base_url, request, len(deployment.workers), seconds, shape, deadline, history
        )
        request = replace(request, max_tokens=shape.max_tokens)
    expected_text, compared_with = (
        reference_text(deployment, case.api, shape, request, deadline, history)
        if request.choices == 1
        else (None, "")
    )
    if shape.guide is not None and backend.decodes_guides:
        guide_kept(deployment, request, expected_text, compared_with, deadline, history)
    # Counters read now, so that only the case's own request counts, not the baseline's: the
    # frontend counts a prompt over --migration-max-seq-len when the request arrives.
    tokens_before = metrics.frontend_output_tokens(metrics_url, model)
    counts_before = metrics.MigrationCounts.parse(metrics.scrape(metrics_url), model)
    prompts_before = metrics.sample_sum(metrics.scrape(metrics_url), metrics.INPUT_TOKENS)
    transfers_before = metrics.once_answered(
        lambda: decode_transfers(deployment), deadline, "every decode worker's transfer count"
    )
    sent_at = time.monotonic()
    inflight = InFlight(
        deployment.base_url, request, read_timeout_s=deadline.remaining() + CLIENT_GRACE_S
    )
    bound = response_bound_s(shape, pace) if pace else None
    response_deadline = deadline.within(bound) if bound else deadline
    history.record(
        "request_sent",
        api=case.api,
        stream=stream,
        prompt_tokens=shape.prompt_tokens,
        max_tokens=shape.max_tokens,
    )
    targets = [w for w in deployment.workers if w.role == where.target_role]
    holder = faults.find_holder(backend, targets, inflight, deadline)
    history.record("holder_found", worker=holder.name, pid=holder.process.pid)
    counted_early = (
        where.proves_kv_transfer
        and backend.kv_transfer_floor_s(case) is None
        and transfer_counted_early(deployment, transfers_before, history)
    )
    evidence: list[str] = []
    if stream:
        tokens_seen, what = (lambda: inflight.response.content_chunks), "streamed content chunks"
    else:
        tokens_seen = lambda: metrics.frontend_output_tokens(metrics_url, model) - tokens_before  # noqa: E731
        what = "tokens received by the frontend"
    proof = faults.prove_in_flight(
        backend,
        holder,
        inflight,
        tokens_seen,
        where.fault_window,
        settings.in_flight_tokens,
        what,
        deadline,
    )
    history.record("in_flight_proven", how=proof)
    seen, proven_at = tokens_seen(), time.monotonic()
    if where.proves_kv_transfer and not counted_early:
        evidence = transfer_evidence(deployment, case, metrics_url, transfers_before, history)
    fault = recovery.send_fault(
        case.fault, holder, inflight, settings, deadline, deployment.pool.nats, history
    )
    faulted_at = time.monotonic()
    recovery.record_fault(deployment, holder, fault, history)
    resume = recovery.Heal(holder, fault, history)
    why = bound and (
        f"{bound:.0f} s after it was sent, the bound its {shape.max_tokens} tokens at the "
        f"slowest measured {pace.slowest:.0f} tokens/s allow"
    )
    wait_s, waits_for = fault_wait(case.fault, case.plane, settings)
    rest_s = None  # how long what the response has left after the fault takes
    if seen:  # a fault while decoding: what is left has a bound from the rate before it
        rate = seen / max(proven_at - sent_at, 1e-3)
        tokens = shape.max_tokens - seen
        rest_s, what, basis = (
            tokens / rate,
            f"{tokens} more tokens at {rate:.0f} tokens/s",
            {"tokens_per_s": round(rate, 1)},
        )
    elif (whole_s := backend.nominal_response_s(case, shape)) is not None:
        # a fault before the first token: the whole response again, at the backend's own speed
        rest_s, what, basis = (
            whole_s,
            f"the whole {whole_s:.1f} s response again",
            {"whole_s": round(whole_s, 2)},
        )
    if rest_s is not None:
        after_s = round(wait_s + RESPONSE_SLOWER_BY * rest_s + RESPONSE_FIXED_S, 1)
        history.record("response_bound", seconds=after_s, **basis)  # as the history keeps it
        if after_s < response_deadline.remaining():
            response_deadline = deadline.within(after_s)
            why = (
                f"{after_s:.0f} s after the fault on {holder.name}, the bound that {waits_for}"
                f"{what} allow"
            )
    try:
        await_response(
            inflight,
            metrics_url,
            model,
            counts_before,
            response_deadline,
            history,
            resume if case.fault in SILENT and case.fault != PAST_LEASE else None,
        )
    except Timeout as exc:
        if not why or deadline.expired():
            raise
        raise CaseFailure(
            f"hung: the response was still open {why}: {last_token(inflight)}; ({exc})"
        ) from None
    record_response(inflight, history)
    # Read now, before anything else reaches the frontend: the count rose when the request
    # arrived, by the prompt as the frontend tokenized it.
    prompt_read = metrics.sample_sum(metrics.scrape(metrics_url), metrics.INPUT_TOKENS)
    expected = expected_outcome(where.fault_window, case.policy, case.fault, where.request)
    counts = settled_counts(
        metrics_url, model, counts_before, expected, backend.migration_counts, deadline
    )
    history.record("metrics_read", counts=counts.as_dict())
    response = inflight.response
    notes, unproven = [], []
    if expected.completes and response.status == 200 and response.error is None:
        kept = continuity.check(
            response,
            shape.max_tokens,
            backend.output_tokens,
            baseline=expected_text,
            why_no_baseline=backend.nondeterministic_because,
            compared_with=compared_with,
            one_token_per_frame=backend.one_token_per_frame,
            migration=migration_evidence(
                deployment,
                case,
                shape,
                holder,
                response,
                prompt_read - prompts_before,
                counts.moves > 0,
                history,
            ),
            ids=backend.output_token_ids,
        )
        history.record(
            "continuity_checked",
            problems=kept.problems,
            notes=kept.notes,
            unproven=kept.unproven,
        )
        evidence, notes, unproven = evidence + kept.problems, kept.notes, kept.unproven
    if shape.guide is not None and not backend.decodes_guides:
        notes.append(f"{backend.name} does not decode guided output: its text is not checked")
    elif shape.guide is not None and response.status == 200 and response.error is None:
        evidence += guided_problems(request, response.text, expected_text)
    mode = backend.migration_counts
    evidence += late_counts(metrics_url, model, counts_before, counts, expected, mode, history)
    if case.fault == PAST_LEASE:
        recovery.await_unlisted(deployment, holder, faulted_at, history)
    if case.fault in SILENT:
        resume()  # if the frontend never counted the move
        evidence += recovery.rejoin_problems(deployment, holder, request, history)
    if case.fault == PAST_LEASE:
        recovery.retire(holder, deadline)
    if case.fault in BROKER:
        evidence += recovery.broker_problems(deployment, case.fault, request, history)
    verdict = judge(
        expected,
        case.policy,
        response,
        counts,
        fault,
        shape.max_tokens,
        backend.migration_counts,
        evidence,
        unproven,
    )
    verdict.notes = notes
    return against_known_defect(verdict, KNOWN_DEFECTS.get(case.fault))


def guide_kept(
    deployment: Deployment,
    request: Request,
    expected_text: str | None,
    compared_with: str,
    deadline: Deadline,
    history: History,
) -> None:
    """Before the fault, proof that the engine decodes the guide: the request undisturbed keeps
    it, and gives the reference where there is one. Else a refusal to move it would prove
    nothing of a guided request. A baseline (`compared_with`) is that request undisturbed
    already: it is not sent again."""
    if compared_with == BASELINE:
        text, expected_text = str(expected_text), None
    else:
        text = undisturbed(deployment, request, deadline, history)
    if problems := guided_problems(request, text, expected_text):
        raise CaseFailure(f"undisturbed, the guided request fails: {'; '.join(problems)}")
    history.record("guide_kept", characters=len(text))


def guided_problems(request: Request, text: str, expected_text: str | None) -> list[str]:
    """Where a guided response's text leaves its guide, and where it departs from the
    reference (or baseline), each named by its first bad character."""
    problems = [broken] if request.guide and (broken := request.guide.broken(text)) else []
    at = continuity.first_divergence(expected_text, text) if expected_text is not None else None
    if at is not None:
        problems.append(
            f"the guided output departs from the reference at character {at + 1}: "
            f"{expected_text[at : at + 40]!r} expected, {text[at : at + 40]!r} received"
        )
    return problems


def migration_evidence(
    deployment: Deployment,
    case: Case,
    shape: Shape,
    holder: Worker,
    response: Response,
    prompt: float,
    moved: bool,
    history: History,
) -> continuity.Migration:
    """What the re-issued context is judged with beside the stream: the prompt's length as the
    frontend tokenized it (`prompt`: what its count rose by with the case's one request), when
    the fault was sent, which other worker of the faulted role logged receiving it, whether the
    frontend counted a move, what that worker's engine holds after `shape`'s prompt, and the
    least time any first token of the case takes (its simulated KV transfer)."""
    backend, role = deployment.backend, topology(case.topology).target_role
    fault_at = history.started + next(e.at for e in history.events if e.name == "fault_sent")
    others = {w.name: w for w in deployment.workers if w.role == role and w is not holder}
    logs = {name: w.process.log_path for name, w in others.items()}
    response_id = response.chunks[0].data.get("id") if response.chunks else None
    taken = continuity.takeover(logs, str(response_id)) if response_id else None
    received = backend.received_context(others[taken.worker], shape.prompt) if taken else None
    history.record(
        "takeover_seen",
        prompt_tokens=int(prompt),
        worker=taken.worker if taken else None,
        received_at=round(taken.received_at - history.started, 4) if taken else None,
        moved=moved,
        received_tokens=None if received is None else len(received),
    )
    floor = backend.kv_transfer_floor_s(case)
    return continuity.Migration(int(prompt), fault_at, taken, moved, received, floor)


def decode_transfers(deployment: Deployment) -> float:
    """The decode workers' count of completed KV transfers (0 without a counter). Raises
    `metrics.Unanswered` while any does not answer: a total without one worker's history, read
    before the request, would let the next full reading "prove" a transfer."""
    counter = deployment.backend.kv_transfer_counter
    if counter is None:
        return 0.0
    ports = {w.name: w.ports["system"] for w in deployment.workers if w.role == "decode"}
    return sum(metrics.worker_sums(ports, counter).values())


def await_response(
    inflight: InFlight,
    metrics_url: str,
    model: str,
    before: metrics.MigrationCounts,
    deadline: Deadline,
    history: History,
    heal: recovery.Heal | None = None,
) -> None:
    """Wait for the response to end, noting when the frontend first counts a migration; from
    then on `heal` decides when the faulted worker is back (`recovery.Heal.after_move`)."""
    migration = FirstMigration(metrics_url, model, before, history)
    checked = [time.monotonic()]

    def probe() -> tuple[bool | None, str]:
        if migration.seen is None or time.monotonic() - checked[0] > FRONTEND_CHECK_S:
            # Read until the migration shows, then once a second: a frontend that stops
            # answering while the client waits fails the case in seconds, by name.
            checked[0] = time.monotonic()
            migration.read()
        if migration.seen is not None and heal is not None:
            heal.after_move(inflight)
        return (True if inflight.finished else None), inflight.response.summary()

    poll_until(probe, deadline, "the response to finish")


def record_start_up(deployment: Deployment, history: History) -> None:
    """When each process was launched, and what the frontend listed as they came up."""
    for process in deployment.processes:
        if process.started_at is not None:
            history.record_at(
                "process_launched", process.started_at, process=process.name, pid=process.pid
            )
    for when, listed in deployment.listings:
        history.record_at("frontend_listed", when, **listed)


def transfer_counted_early(deployment: Deployment, before: float, history: History) -> bool:
    """One read of the decode workers' transfer counter once one holds the request (its KV came
    first). The counter lives on the worker about to be faulted, and a busy vLLM CPU worker's
    /metrics took 2.7 s to answer: read here, the fault can follow the in-flight proof at once.
    If the counter lags, or a worker does not answer, `transfer_evidence` waits for it after the
    proof, as before."""
    counter = deployment.backend.kv_transfer_counter
    if counter is None:
        return False
    try:
        total = decode_transfers(deployment)
    except metrics.Unanswered:
        return False
    if total <= before:
        return False
    history.record("kv_transfer_checked", counter=counter, transfers=total - before)
    return True


def transfer_evidence(
    deployment: Deployment, case: Case, metrics_url: str, before: float, history: History
) -> list[str]:
    """kv_transfer cases, before the fault: the first token came after the known transfer
    time, or the decode workers' transfer counter rose past its value at the request."""
    backend, model = deployment.backend, deployment.model
    floor = backend.kv_transfer_floor_s(case)
    if floor is not None:
        assert model is not None
        ttft = metrics.frontend_mean_ttft(metrics_url, model.name)
        history.record("kv_transfer_checked", ttft_s=ttft, transfer_floor_s=round(floor, 4))
        return transfer_problems(ttft, floor)
    counter = backend.kv_transfer_counter
    if counter is None:
        return [f"backend {backend.name!r} gives no KV transfer time or counter: unproven"]

    def counted() -> tuple[float | None, str]:
        try:
            total = decode_transfers(deployment)
        except metrics.Unanswered as exc:
            return None, str(exc)
        return (total if total > before else None), f"{counter} = {total:g} on the decode workers"

    try:
        total = poll_until(counted, Deadline(TRANSFER_COUNT_WAIT_S), f"{counter} to rise")
    except Timeout as exc:
        return [f"no KV transfer counted before the fault: {exc}"]
    history.record("kv_transfer_checked", counter=counter, transfers=total - before)
    return []
