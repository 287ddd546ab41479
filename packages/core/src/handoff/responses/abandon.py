"""A client that leaves (cases.ABANDONS): it closes its stream mid-response, once the request
has moved, or while the worker holding it is stopped. The frontend must count the close once
and move nothing it should not, and every worker that held the request must stop it: none may
go on generating for a client that has gone."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from handoff import faults, metrics
from handoff.backend import Worker
from handoff.cases import ABANDONS, STALLS, Case, topology
from handoff.client import InFlight, Request
from handoff.deployment import Deployment
from handoff.errors import CaseFailure
from handoff.history import History
from handoff.machine import worker_logs
from handoff.machine.worker_logs import ANSI
from handoff.policies import expected_outcome
from handoff.polling import Deadline, Timeout, poll_until
from handoff.responses import recovery
from handoff.responses.waits import CLIENT_GRACE_S, Settings, record_response, settled_counts
from handoff.verdict import Verdict, count_problems

#: What the frontend counts of a client that leaves, as Dynamo 1.6.1 names it: each rises by
#: exactly one (docs/cases.md).
CLOSE_COUNTERS = (
    ("dynamo_frontend_disconnected_clients", {}),
    ("dynamo_frontend_model_cancellation_total", {"request_type": "stream"}),
    ("dynamo_frontend_requests_total", {"error_type": "cancelled"}),
)
#: A worker's count of the cancellations it took.
WORKER_CANCELLATIONS = "dynamo_component_cancellation_total"
#: The lines a worker's log gives a request (with its id): its end, the frontend's
#: cancellation taken (its counter rises by one), and a response it could not send because the
#: stream had gone. A worker stops on whichever it meets first: a running one and a resumed
#: one were each seen to stop either way (Dynamo 1.6.1, measured: docs/cases.md).
ENDED = "request completed"
CANCELLED = "request cancellation received"
UNSENT = "Failed to publish response for stream"
#: How long every worker that held the request has to stop it once the client has left (or,
#: stopped then, once it runs again). Measured: within 0.1 s (benchmarks/RESULTS.md).
STOP_BOUND_S = 5.0
#: How long past its stream timeout the frontend is watched for a move it must not make: its
#: router moved a stalled worker's request 0.01-0.23 s after the timeout (benchmarks/RESULTS.md).
#: Twice the timeout would hold a vLLM worker (5 s) stopped past its 10 s discovery lease, after
#: which Dynamo 1.6.1 never routes to it again (Dynamo issue 3493).
MOVE_WATCH_MARGIN_S = 2.0


@dataclass(frozen=True)
class Readings:
    """The counters a close moves: the frontend's (`CLOSE_COUNTERS`, by name) and each
    worker's cancellations (by worker name)."""

    frontend: dict[str, float]
    workers: dict[str, float]

    @classmethod
    def take(cls, deployment: Deployment, workers: list[Worker], deadline: Deadline) -> Readings:
        text = metrics.scrape(deployment.base_url + "/metrics")
        ports = {w.name: w.ports["system"] for w in workers}
        counted = metrics.once_answered(
            lambda: metrics.worker_sums(
                ports, WORKER_CANCELLATIONS, {"dynamo_endpoint": "generate"}
            ),
            deadline.within(metrics.WORKER_READ_S * 2),
            f"every worker's {WORKER_CANCELLATIONS}",
        )
        frontend = {name: metrics.sample_sum(text, name, labels) for name, labels in CLOSE_COUNTERS}
        return cls(frontend, counted)


def exercise_abandon(
    deployment: Deployment,
    case: Case,
    settings: Settings,
    deadline: Deadline,
    history: History,
    variant: int = 0,
) -> Verdict:
    """Stream a request, let the lifecycle's worker fault come first (none, a kill, a stall),
    hang up, and judge what the frontend counted and what every worker that held it did."""
    backend, where = deployment.backend, topology(case.topology)
    assert deployment.model is not None
    metrics_url, model = deployment.base_url + "/metrics", deployment.model.name
    shape = backend.shape(case, variant)
    request = Request(
        case.api, True, model, shape.prompt, shape.max_tokens, request_id=str(uuid.uuid4())
    )
    targets = [w for w in deployment.workers if w.role == where.target_role]
    counts_before = metrics.MigrationCounts.parse(metrics.scrape(metrics_url), model)
    before = Readings.take(deployment, targets, deadline)
    inflight = InFlight(
        deployment.base_url, request, read_timeout_s=deadline.remaining() + CLIENT_GRACE_S
    )
    history.record(
        "request_sent", api=case.api, stream=True, max_tokens=shape.max_tokens,
        request_id=request.request_id,
    )  # fmt: skip
    holder = faults.find_holder(backend, targets, inflight, deadline)
    history.record("holder_found", worker=holder.name, pid=holder.process.pid)
    chunks = lambda: inflight.response.content_chunks  # noqa: E731
    proof = faults.prove_in_flight(
        backend, holder, inflight, chunks, where.fault_window, settings.in_flight_tokens,
        "streamed content chunks", deadline,
    )  # fmt: skip
    history.record("in_flight_proven", how=proof)
    heal = None
    if first := ABANDONS[case.fault]:
        report = recovery.send_fault(first, holder, inflight, settings, deadline, None, history)
        recovery.record_fault(deployment, holder, report, history)
        heal = recovery.Heal(holder, report, history) if first in STALLS else None
    if case.fault == "close_after_move":  # the client leaves once the successor streams it
        survivors = [w for w in targets if w is not holder]
        successor = faults.find_holder(backend, survivors, inflight, deadline)
        proof = faults.prove_in_flight(
            backend, successor, inflight, chunks, where.fault_window,
            chunks() + settings.in_flight_tokens, "streamed content chunks", deadline,
        )  # fmt: skip
        history.record("moved_in_flight", worker=successor.name, how=proof)
    if inflight.finished:
        raise CaseFailure(
            f"missed the window: the response ended before the client could leave it: "
            f"{inflight.response.summary()}"
        )
    closed_at = inflight.close()
    history.record_at("client_closed", closed_at, chunks=chunks())
    try:
        problems = []
        if heal is not None:  # the stall: the frontend must not move what its client left
            problems += unmoved_while_stopped(metrics_url, model, counts_before, settings, history)
            heal()
        problems += stop_problems(deployment, request, before, deadline, history)
        if heal is not None:  # and the worker, running again, must be routed to again
            problems += recovery.rejoin_problems(deployment, holder, request, history)
    finally:
        if heal is not None:
            heal()
    poll_until(lambda: (True if inflight.finished else None, "open"), deadline, "the client")
    record_response(inflight, history)
    expected = expected_outcome(where.fault_window, case.policy, case.fault, where.request)
    counts = settled_counts(
        metrics_url, model, counts_before, expected, backend.migration_counts, deadline
    )
    history.record("metrics_read", counts=counts.as_dict())
    problems += count_problems(expected, counts, backend.migration_counts)
    problems += response_problems(inflight)
    problems += recovery.idle_problems(deployment, metrics_url, deadline, history)
    return Verdict(passed=not problems, reasons=problems, phase=history.phase)


def unmoved_while_stopped(
    metrics_url: str,
    model: str,
    before: metrics.MigrationCounts,
    settings: Settings,
    history: History,
) -> list[str]:
    """With the holder stopped and its client gone, the frontend must not move the request:
    its counters are watched until its router's stream timeout would have moved it, and a
    margin (`MOVE_WATCH_MARGIN_S`)."""
    window_s = settings.stream_timeout_s + MOVE_WATCH_MARGIN_S

    def probe() -> tuple[metrics.MigrationCounts | None, str]:
        moved = metrics.MigrationCounts.parse(metrics.scrape(metrics_url), model).since(before)
        return (moved if moved.moves else None), "no move"

    try:
        moved = poll_until(probe, Deadline(window_s), "a move the frontend must not make")
    except Timeout:  # the window passed with nothing moved: as it must be
        history.record("no_move_while_stopped", seconds=window_s)
        return []
    history.record("migration_seen", **moved.as_dict())
    return [f"the frontend moved a request whose client had left ({moved}): work for nobody"]


def stop_problems(
    deployment: Deployment,
    request: Request,
    before: Readings,
    deadline: Deadline,
    history: History,
) -> list[str]:
    """Every worker that logged the request, and is alive, stops it within `STOP_BOUND_S`: its
    in-flight gauge falls to 0. The last of them, which held it when the client left, logs its
    end and why (`CANCELLED`, `UNSENT` or both), and its cancellation counter agrees with its
    log; no other worker took a cancellation."""
    rid = str(request.request_id)
    held = worker_logs.received(deployment.workers, {rid}).get(rid, [])
    alive = [w for w in deployment.workers if w.name in held and w.process.exit_code() is None]
    if not alive:
        return [f"no live worker logged the request {rid}: who held it when its client left?"]
    last = next((w for w in alive if w.name == held[-1]), None)
    problems: list[str] = []
    started = time.monotonic()
    for worker in alive:
        try:
            stopped_s = await_stopped(deployment, worker, started, deadline)
        except Timeout as exc:
            problems.append(f"{worker.name} went on with the request after its client left: {exc}")
            continue
        history.record("request_stopped", worker=worker.name, seconds=round(stopped_s, 3))
    if problems:  # what a worker that never stopped counted cannot be read from it
        return problems
    if last is None:
        return [f"{held[-1]}, which held the request last, is gone: nothing to judge"]
    found = ended_because(last, rid, deadline)
    history.record("request_ended", worker=last.name, logged=sorted(found or ()))
    if found is None:
        problems.append(f"{last.name} never logged {ENDED!r} for the request {rid}")
        found = set()
    elif not found:
        problems.append(
            f"{last.name} ended the request {rid} without logging {CANCELLED!r} or {UNSENT!r}"
        )
    rises = 1 if CANCELLED in found else 0
    # Every live worker that was counted before, or held the request: a successor started
    # after the fault that never held it may not answer yet, and took nothing.
    counted = [
        w
        for w in deployment.workers
        if w.process.exit_code() is None and (w.name in before.workers or w.name in held)
    ]
    after = Readings.take(deployment, counted, deadline)
    for worker in counted:
        want = rises if worker is last else 0
        got = after.workers[worker.name] - before.workers.get(worker.name, 0.0)
        if got != want:
            problems.append(
                f"{worker.name}'s {WORKER_CANCELLATIONS} rose by {got:g}, expected {want}"
            )
    history.record("cancellations_counted", workers=after.workers, frontend=after.frontend)
    for name, _ in CLOSE_COUNTERS:
        if (rose := after.frontend[name] - before.frontend[name]) != 1:
            problems.append(f"the frontend's {name} rose by {rose:g}, expected 1")
    return problems


def await_stopped(
    deployment: Deployment, worker: Worker, since: float, deadline: Deadline
) -> float:
    """Seconds from `since` until `worker` reports nothing in flight; a reading that fails is
    unknown, and polled again."""

    def probe() -> tuple[float | None, str]:
        try:
            held = deployment.backend.in_flight([worker])[worker.name]
        except metrics.Unanswered as exc:
            return None, str(exc)
        return (time.monotonic() - since if not held else None), f"{held:g} in flight"

    return poll_until(probe, deadline.within(STOP_BOUND_S), f"{worker.name} to stop the request")


def ended_because(worker: Worker, rid: str, deadline: Deadline) -> set[str] | None:
    """Of `CANCELLED` and `UNSENT`, those the worker's log says of the request `rid` once it
    logs the request's end (within `STOP_BOUND_S`); None if it never does."""

    def probe() -> tuple[set[str] | None, str]:
        text = ANSI.sub("", worker.process.log_path.read_text(errors="replace"))
        entries = [entry for entry in text.splitlines() if rid in entry]
        said = {line for line in (ENDED, CANCELLED, UNSENT) if any(line in e for e in entries)}
        return (said - {ENDED} if ENDED in said else None), f"{sorted(said)} so far"

    try:
        return poll_until(probe, deadline.within(STOP_BOUND_S), f"{ENDED!r} in {worker.name}'s log")
    except Timeout:
        return None


def response_problems(inflight: InFlight) -> list[str]:
    """Until the client left, the stream carried no error and nothing an OpenAI client cannot
    read."""
    response = inflight.response
    problems = [f"the frontend broke the protocol: {p}" for p in response.protocol_errors]
    if response.status != 200 or response.error is not None:
        problems.append(f"the stream failed before its client left: {response.summary()}")
    return problems
