"""One case from start to finish: deploy, request, fault, verdict, teardown."""

from __future__ import annotations

import shutil
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import requests

from handoff import client, continuity, faults, metrics
from handoff.backend import Backend, Worker
from handoff.cases import BROKER, PAST_LEASE, SILENT, STALLS, Case, topology
from handoff.client import InFlight, Request, Response
from handoff.deployment import Deployment, silent
from handoff.errors import CaseFailure, HandoffError
from handoff.history import History
from handoff.machine.pace import measure_pace, response_bound_s, sized_to
from handoff.machine.wallclock import step_reason
from handoff.policies import (
    KNOWN_DEFECTS,
    SERVICE_UNAVAILABLE,
    Policy,
    expected_outcome,
    policy,
)
from handoff.polling import Deadline, Timeout, interruptible, poll_until
from handoff.pool import Pools
from handoff.responses import load
from handoff.responses.waits import (
    CLIENT_GRACE_S,
    RESPONSE_FIXED_S,
    RESPONSE_SLOWER_BY,
    FirstMigration,
    Settings,
    fault_wait,
    last_token,
    late_counts,
    record_response,
    settled_counts,
)
from handoff.verdict import (
    Verdict,
    against_known_defect,
    carries,
    judge,
    transfer_problems,
)

#: The first token follows the transfer; its counter may lag the token. On two CPU cores shared
#: with vLLM's spinning NIXL threads it lagged by more than 1 s once (benchmarks/RESULTS.md); the
#: bound only costs time when the counter never rises.
TRANSFER_COUNT_WAIT_S = 5.0
#: How often the frontend's /metrics is read, as a sign of life, while the response runs.
FRONTEND_CHECK_S = 1.0
#: How long a frontend that stopped answering is given to finish exiting, to tell the two apart.
EXIT_WAIT_S = 1.0
#: The frontend's inactivity timeout on a worker's response stream, in whole seconds. Unset,
#: Dynamo 1.6.1 keeps a stalled worker's stream open for as long as the stall lasts.
STREAM_TIMEOUT_ENV = "DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS"
#: How long a resumed worker may take to serve a request again: the frontend avoids a worker
#: that failed for about 5 s (docs/known-issues.md).
REJOIN_BOUND_S = 15.0
#: How long a stopped worker may stay listed by the frontend: on Dynamo 1.6.1 its file-store
#: lease ran out about 10 s after the stop (docs/known-issues.md).
LEASE_BOUND_S = 30.0
#: What the resumed worker is asked, one short request at a time, until it serves one.
REJOIN_TOKENS = 4
#: The frontend's NATS request timeout in the broker's cases, in whole seconds: a new request
#: sent while the broker is down is refused once its attempts have timed out, after about 40 s
#: at Dynamo 1.6.1's default of 10 s (docs/known-issues.md).
NATS_TIMEOUT_ENV = "DYN_NATS_REQUEST_TIMEOUT_SECS"
BROKER_REQUEST_TIMEOUT_S = 2
#: How long that refusal may take: every attempt the migration limit allows, each a timeout,
#: BROKER_REFUSAL_SLOWER_BY times slower, and BROKER_REFUSAL_FIXED_S.
BROKER_REFUSAL_SLOWER_BY = 2.0
BROKER_REFUSAL_FIXED_S = 5.0
#: How long new requests may fail once the broker is back: the first succeeded 3.1-3.9 s after
#: a restart (docs/known-issues.md); a request that waits on a NATS timeout takes 10 s.
RECOVERY_BOUND_S = 30.0
#: The longest a probe of the recovery waits for its answer: a request published while the
#: frontend's NATS client reconnects fails over only after four 10 s attempts.
PROBE_READ_S = 12.0


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
            exercised = load.exercise_load if topology(case.topology).load else exercise
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
        verdict = Verdict(False, verdict.reasons + problems, verdict.phase)
    owner = deployment.pool if deployment else pool
    step = owner.clock.stepped() if owner else None
    if step is not None:
        verdict = clock_stepped(verdict, step, history)
    spoilt = step is not None or not (verdict.passed or verdict.upstream_defect)
    if pools and pool and spoilt:
        # Its workers may hold the failure's state: no later case gets them; logs go with it.
        # A known upstream defect is not theirs: its pool goes on, as after a pass. A pool
        # whose wall clock stepped may have lost its leases: it goes too.
        discarded = pools.discard(pool, keep_in=folder)
        history.record("pool_discarded", pool=pool.name, problems=discarded)
    history.record("verdict", passed=verdict.passed, reasons=verdict.reasons)
    history.write(folder / "history.json")
    if verdict.passed and not settings.keep_logs:
        drop_logs(folder)
    return CaseResult(case, verdict, time.monotonic() - started, folder, history)


def clock_stepped(verdict: Verdict, step_s: float, history: History) -> Verdict:
    """A case whose deployment saw the wall clock step: a pass keeps the step as a note (its
    evidence held); a failure, a known upstream defect's too, leads with it and stays failed."""
    history.record("wall_clock_stepped", seconds=step_s)
    if verdict.passed:
        verdict.notes.append(step_reason(step_s))
        return verdict
    return Verdict(False, [step_reason(step_s), *verdict.reasons], verdict.phase, verdict.notes)


def fault_env(case: Case, settings: Settings) -> dict[str, str]:
    """What bounds the fault's wait at the frontend. A stall or a partition is silence on the
    worker's response stream: the frontend's inactivity timeout ends it. A lost broker leaves a
    new request waiting on NATS: the NATS request timeout ends it."""
    if case.fault in SILENT:
        return {STREAM_TIMEOUT_ENV: str(settings.stream_timeout_s)}
    if case.fault in BROKER:
        return {NATS_TIMEOUT_ENV: str(BROKER_REQUEST_TIMEOUT_S)}
    return {}


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
    stream = case.response == "stream"
    request = Request(case.api, stream, model, shape.prompt, shape.max_tokens)
    pace = None
    if (seconds := backend.output_seconds(case)) is not None:
        pace = measure_pace(deployment.base_url, request, len(deployment.workers), deadline)
        shape = sized_to(pace, seconds, shape)
        request = replace(request, max_tokens=shape.max_tokens)
        history.record(
            "paced",
            slowest_tokens_per_s=round(pace.slowest, 1),
            fastest_tokens_per_s=round(pace.fastest, 1),
            max_tokens=shape.max_tokens,
        )
    expected_text, compared_with = backend.reference(case.api, shape), "the reference"
    if expected_text is None and backend.deterministic:
        expected_text = undisturbed(deployment, request, deadline, history)
        compared_with = "the undisturbed baseline"
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
    broker = deployment.pool.nats
    faulted = broker if case.fault in BROKER and broker else holder.process
    history.record(
        "fault_sent",
        fault=case.fault,
        signal=faults.FIRST_SIGNAL[case.fault],
        worker=holder.name if faulted is holder.process else faulted.name,
        pid=faulted.pid,
    )
    fault = faults.inject(case.fault, holder, inflight, settings.graceful_bound_s, deadline, broker)
    faulted_at = time.monotonic()
    resumed: list[str] = []

    def resume() -> None:
        """A stalled or cut-off holder is healed once the frontend has counted the move: the
        response may still be streaming from its successor, and must take no late token from
        it. Any later, a stall outlives the worker's discovery lease on a slow engine (vLLM on
        a CPU), and Dynamo 1.6.1 never routes to it again (docs/known-issues.md)."""
        if not resumed:
            dropped = fault.cut.dropped() if fault.cut else None
            faults.heal(holder, fault)
            resumed.append(holder.name)
            history.record("worker_resumed", worker=holder.name, packets_dropped=dropped)

    if case.fault in STALLS:
        history.record("worker_stopped", signals=list(fault.signals))
    elif fault.cut is not None:
        history.record("worker_cut_off", table=fault.cut.table, rules=len(fault.cut.flows))
    elif case.fault in BROKER:
        history.record("broker_faulted", signals=list(fault.signals))
    else:
        history.record("worker_gone", signals=list(fault.signals))
        if successor := deployment.replace(holder):
            history.record("successor_started", worker=successor)
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
    expected = expected_outcome(where.fault_window, case.policy, case.fault)
    counts = settled_counts(
        metrics_url, model, counts_before, expected, backend.migration_counts, deadline
    )
    history.record("metrics_read", counts=counts.as_dict())
    response = inflight.response
    notes = []
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
                targets, holder, response, prompt_read - prompts_before, history
            ),
        )
        history.record("continuity_checked", problems=kept.problems, notes=kept.notes)
        evidence, notes = evidence + kept.problems, kept.notes
    mode = backend.migration_counts
    evidence += late_counts(metrics_url, model, counts_before, counts, expected, mode, history)
    if case.fault == PAST_LEASE:
        await_unlisted(deployment, holder, faulted_at, history)
    if case.fault in SILENT:
        resume()  # if the frontend never counted the move
        evidence += rejoin_problems(deployment, holder, request, history)
    if case.fault == PAST_LEASE:
        retire(holder, deadline)
    if case.fault in BROKER:
        evidence += refusal_problems(deployment, request, history)
        evidence += recovery_problems(deployment, case.fault, request, history)
    verdict = judge(
        expected,
        case.policy,
        response,
        counts,
        fault,
        shape.max_tokens,
        backend.migration_counts,
        evidence,
    )
    verdict.notes = notes
    return against_known_defect(verdict, KNOWN_DEFECTS.get(case.fault))


def refusal_problems(deployment: Deployment, request: Request, history: History) -> list[str]:
    """While the broker is still down, a new request must be refused with the migration path's
    503 once the attempts the migration limit allows have timed out: never served, never left
    hanging. Sent after the case's counters were read, so its attempts (`new_request`) are not
    the case's; the history has what they added."""
    attempts = deployment.policy.migration_limit + 1
    bound_s = (
        BROKER_REFUSAL_SLOWER_BY * attempts * BROKER_REQUEST_TIMEOUT_S + BROKER_REFUSAL_FIXED_S
    )
    metrics_url, model = deployment.base_url + "/metrics", deployment.model.name
    before = metrics.MigrationCounts.parse(metrics.scrape(metrics_url), model)
    response, sent_at = Response(), time.monotonic()
    client.send(deployment.base_url, short(request), response, read_timeout_s=bound_s)
    seconds = round(time.monotonic() - sent_at, 2)
    added = metrics.MigrationCounts.parse(metrics.scrape(metrics_url), model).since(before)
    history.record(
        "refused_while_down", seconds=seconds, status=response.status, counts=added.as_dict()
    )
    problems = []
    if not carries(response, SERVICE_UNAVAILABLE) or seconds > bound_s:
        problems.append(
            f"a new request sent while the broker was down must be refused with "
            f"{SERVICE_UNAVAILABLE} within {bound_s:g} s ({attempts} attempt(s) of "
            f"{BROKER_REQUEST_TIMEOUT_S} s); after {seconds:g} s: {response.summary()}"
        )
    if (added.failed, added.succeeded) != (1, 0):
        problems.append(
            f"the request refused while the broker was down must count as one failed migration "
            f"and no success; the counters added {added.as_dict()}"
        )
    return problems


def recovery_problems(
    deployment: Deployment, fault: str, request: Request, history: History
) -> list[str]:
    """The broker back (SIGCONT, or nats-server started again on its port), new requests must
    work again: short requests go out one at a time until one completes, within
    RECOVERY_BOUND_S; the time it took is in the history."""
    pool = deployment.pool
    if fault == "broker_stall":
        assert pool.nats is not None
        pool.nats.signal_tree(signal.SIGCONT)
    else:
        pool.restart_nats()
    healed_at = time.monotonic()
    history.record("broker_healed", how="SIGCONT" if fault == "broker_stall" else "restarted")

    def completed(response: Response) -> tuple[bool | None, str]:
        return (True if response.status == 200 and response.error is None else None), ""

    try:
        sent = short_requests_until(
            deployment, request, completed, RECOVERY_BOUND_S, PROBE_READ_S,
            "a new request to complete",
        )  # fmt: skip
    except Timeout as exc:
        return [
            f"new requests still failed {RECOVERY_BOUND_S:g} s after the broker came back: "
            f"{exc}; {deployment.view()}"
        ]
    seconds = round(time.monotonic() - healed_at, 2)
    first = sent[0].summary() if len(sent) > 1 else None
    history.record("broker_recovered", seconds=seconds, requests=len(sent), first_failed=first)
    return []


def rejoin_problems(
    deployment: Deployment, holder: Worker, request: Request, history: History
) -> list[str]:
    """A resumed or healed worker must serve again: short requests go out one at a time until
    its own request count rises, within REJOIN_BOUND_S; none served names it unroutable."""
    port = {holder.name: holder.ports["system"]}

    def served() -> float:
        return metrics.worker_sums(port, metrics.REQUESTS, {"dynamo_endpoint": "generate"})[
            holder.name
        ]

    before = metrics.once_answered(served, Deadline(REJOIN_BOUND_S), f"{holder.name}'s requests")

    def counted(response: Response) -> tuple[float | None, str]:
        try:
            now = served()
        except metrics.Unanswered as exc:
            return None, str(exc)
        return (now if now > before else None), ""

    try:
        sent = short_requests_until(
            deployment, request, counted, REJOIN_BOUND_S, REJOIN_BOUND_S,
            f"{holder.name} to serve a request again",
        )  # fmt: skip
    except Timeout as exc:
        return [unrejoined(deployment, holder, exc)]
    history.record("worker_rejoined", worker=holder.name, requests=len(sent))
    return []


def unrejoined(deployment: Deployment, holder: Worker, exc: Timeout) -> str:
    """Why the healed holder was not served by: where the frontend also dropped workers that
    were never faulted, the deployment lost leases beyond the fault, and that is said first.
    One reading of the listing backs both."""
    failed = f"{holder.name}, healed after its fault, was never routed to again: {exc}"
    try:
        listing = deployment.listing()
    except (requests.RequestException, ValueError) as error:
        return f"{failed}; {silent(error)}"
    view = deployment.describe(listing)
    bystanders = [name for name in deployment.unlisted_in(listing[0]) if name != holder.name]
    if not bystanders:
        return f"{failed}; {view}"
    return (
        f"the frontend dropped {', '.join(bystanders)}, never faulted: the deployment lost "
        f"discovery leases beyond the fault (a wall-clock step, or keep-alives starved), so "
        f"{holder.name}'s own rejoin is not what this judged; {failed}; {view}"
    )


def await_unlisted(
    deployment: Deployment, holder: Worker, stopped_at: float, history: History
) -> None:
    """The proof that a stall outlived the holder's discovery lease: the frontend no longer
    lists any instance of it, within LEASE_BOUND_S of the stop. Without the holder's instance
    ids there is no proof: unknown, never unlisted."""
    if not deployment.pool.instance_ids.get(holder.name):
        raise CaseFailure(
            f"no instance id of {holder.name} is known: its leaving discovery cannot be proven"
        )

    def probe() -> tuple[bool | None, str]:
        try:
            listed, _ = deployment.listing()
        except (requests.RequestException, ValueError) as exc:
            return None, silent(exc)
        gone = holder.name in deployment.unlisted_in(listed)
        return (True if gone else None), f"{holder.name} listed"

    left_s = LEASE_BOUND_S - (time.monotonic() - stopped_at)
    try:
        poll_until(probe, Deadline(max(left_s, 0.0)), f"the frontend to drop {holder.name}")
    except Timeout as exc:
        raise CaseFailure(
            f"the stall did not outlive {holder.name}'s discovery lease: still listed "
            f"{LEASE_BOUND_S:g} s after SIGSTOP ({exc})"
        ) from None
    history.record(
        "worker_unlisted", worker=holder.name, seconds=round(time.monotonic() - stopped_at, 2)
    )


def retire(holder: Worker, deadline: Deadline) -> None:
    """SIGKILL a worker resumed after its lease ran out: Dynamo 1.6.1 never lists it again, so
    no later case of its pool may draw it; its pool replaces it as it replaces a killed one."""
    holder.process.signal_tree(signal.SIGKILL)
    if left := holder.process.wait_gone(deadline.within(faults.HOLDER_TIMEOUT_S)):
        raise CaseFailure(f"{holder.name} still alive after SIGKILL: {left}")


def short(request: Request) -> Request:
    """The case's request as a probe of whether the deployment serves: unary, REJOIN_TOKENS
    long."""
    return replace(request, stream=False, max_tokens=REJOIN_TOKENS)


def short_requests_until(
    deployment: Deployment,
    request: Request,
    answered: Callable[[Response], tuple[object | None, str]],
    bound_s: float,
    read_s: float,
    awaited: str,
) -> list[Response]:
    """Send `request`, unary and REJOIN_TOKENS long, one at a time until `answered` (given
    each response) returns a result, within `bound_s`; every response sent. Timeout past it,
    naming the last response and what `answered` saw."""
    probe_request = short(request)
    sent: list[Response] = []

    def probe() -> tuple[object | None, str]:
        sent.append(Response())
        client.send(deployment.base_url, probe_request, sent[-1], read_timeout_s=read_s)
        result, seen = answered(sent[-1])
        detail = f"; {seen}" if seen else ""
        return result, f"{len(sent)} request(s), {sent[-1].summary()}{detail}"

    poll_until(probe, Deadline(bound_s), awaited)
    return sent


def migration_evidence(
    targets: list[Worker],
    holder: Worker,
    response: Response,
    prompt: float,
    history: History,
) -> continuity.Migration:
    """What the re-issued context is judged with beside the stream: the prompt's length as the
    frontend tokenized it (`prompt`: what its count rose by with the case's one request), when
    the fault was sent, and which other worker of the faulted role logged receiving it."""
    fault_at = history.started + next(e.at for e in history.events if e.name == "fault_sent")
    logs = {w.name: w.process.log_path for w in targets if w is not holder}
    response_id = response.chunks[0].data.get("id") if response.chunks else None
    taken = continuity.takeover(logs, str(response_id)) if response_id else None
    history.record(
        "takeover_seen",
        prompt_tokens=int(prompt),
        worker=taken.worker if taken else None,
        received_at=round(taken.received_at - history.started, 4) if taken else None,
    )
    return continuity.Migration(int(prompt), fault_at, taken)


def undisturbed(deployment: Deployment, request: Request, deadline: Deadline, history: History):
    """The text of the same request with no fault: what a deterministic engine must give
    again after the migration."""
    history.record("baseline_sent")
    response = Response()
    client.send(deployment.base_url, request, response, read_timeout_s=deadline.remaining())
    history.record("baseline_finished", response=response.summary())
    if response.status != 200 or response.error or response.exception:
        raise CaseFailure(f"the undisturbed baseline request failed: {response.summary()}")
    return response.text


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
    on_migration: Callable[[], None] | None = None,
) -> None:
    """Wait for the response to end, noting when the frontend first counts a migration (and
    calling `on_migration` then)."""
    migration = FirstMigration(metrics_url, model, before, history)
    checked = [time.monotonic()]

    def probe() -> tuple[bool | None, str]:
        if migration.seen is None or time.monotonic() - checked[0] > FRONTEND_CHECK_S:
            # Read until the migration shows, then once a second: a frontend that stops
            # answering while the client waits fails the case in seconds, by name.
            checked[0] = time.monotonic()
            if migration.read() and on_migration:
                on_migration()
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
