"""A client that leaves (the `abandoned` topology): it closes its stream mid-response, once
the request has moved, or while the worker holding it is stopped. The frontend must count the
close once and move nothing it should not, and every worker that held the request must stop it,
in its handler and in its engine: none may go on generating for a client that has gone."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from handoff import faults, metrics
from handoff.backend import Backend, Shape, Worker
from handoff.cases import Case, topology
from handoff.client import InFlight, Request, Response
from handoff.deployment import Deployment
from handoff.errors import MissedAfterFault, MissedWindow
from handoff.history import History
from handoff.machine import worker_logs
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.policies import expected_outcome, known_defect
from handoff.responses import evidence, recovery
from handoff.responses.waits import (
    CLIENT_GRACE_S,
    REFERENCE,
    CaseRun,
    Settings,
    proof_deadline,
    record_response,
    settled_counts,
)
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
#: one were each seen to stop either way (Dynamo 1.6.1, measured: docs/cases.md as of 708d296).
ENDED = "request completed"
CANCELLED = "request cancellation received"
UNSENT = "Failed to publish response for stream"
#: How long every worker that held the request has to stop it once the client has left (or,
#: stopped then, once it runs again). Measured: within 0.1 s (benchmarks/RESULTS.md).
STOP_BOUND_S = 5.0
#: How much longer than the frontend took to answer, measured in the case, a move made when
#: its stream timeout fires may take to show in its counters: the watch of a stalled request
#: whose client left runs that long past the timeout (`MoveWatch`), as a response is given
#: RESPONSE_SLOWER_BY times its measured rate.
MOVE_SLOWER_BY = 4.0


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
        return cls(frontend_closes(text), counted)


def frontend_closes(text: str) -> dict[str, float]:
    """`CLOSE_COUNTERS` as the frontend's page `text` gives them, by name."""
    return {name: metrics.sample_sum(text, name, labels) for name, labels in CLOSE_COUNTERS}


class Leaving:
    """A client that leaves as the exercise's workload (`responses.exercise`): a stream whose
    lifecycle's worker fault comes first (none, a kill, a stall), then its client hangs up;
    judged by what the frontend counted and what every worker that held it did."""

    holder: Worker | None = None
    faulted: str | None = None

    def __init__(self, run: CaseRun) -> None:
        deployment, case, _, deadline, _ = run.parts
        self.run, self.defect = run, known_defect(case, run.deployment.pool.mix)
        assert deployment.model is not None
        self.metrics_url = deployment.base_url + "/metrics"
        self.shape = shape = deployment.backend.shape(case, run.variant)
        self.request = Request(
            case.api, True, deployment.model.name, shape.prompt, shape.max_tokens,
            request_id=str(uuid.uuid4()), annotations=shape.annotations,
            top_logprobs=deployment.backend.top_logprobs(case),
        )  # fmt: skip
        role = topology(case.topology).target_role
        self.targets = [w for w in deployment.workers if w.role == role]
        self.counts_before = metrics.MigrationCounts.read(self.metrics_url, deployment.model.name)
        self.before = Readings.take(deployment, self.targets, deadline)
        self.heal: recovery.Heal | None = None
        self.problems: list[str] = []

    def __enter__(self) -> Leaving:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.heal is not None:  # never leave a stalled worker stopped
            self.heal()

    def send(self) -> None:
        deployment, case, _, deadline, history = self.run.parts
        self.inflight = InFlight(
            deployment.base_url, self.request, read_timeout_s=deadline.remaining() + CLIENT_GRACE_S
        )
        history.record(
            "request_sent", api=case.api, stream=True, max_tokens=self.shape.max_tokens,
            request_id=self.request.request_id,
        )  # fmt: skip

    def hold(self) -> None:
        deployment, case, settings, deadline, history = self.run.parts
        backend, needed = deployment.backend, settings.in_flight_tokens
        proving, _ = proof_deadline(backend, case, self.shape, None, needed, deadline)
        self.holder = faults.find_holder(backend, self.targets, self.inflight, deadline)
        history.record("holder_found", worker=self.holder.name, pid=self.holder.process.pid)
        proof = faults.prove_in_flight(
            backend, self.holder, self.inflight, self.chunks, topology(case.topology).fault_window,
            needed, "streamed content chunks", proving,
        )  # fmt: skip
        history.record("in_flight_proven", how=proof.how)

    def chunks(self) -> int:
        return self.inflight.response.content_chunks

    def inject(self) -> None:
        """The lifecycle's worker fault (none, a kill, a stall) and, after a kill, the successor
        proven to hold the request; the response still open; then the client leaves."""
        run, holder = self.run, self.holder
        assert holder is not None
        lifecycle, history = run.lifecycle, run.history
        if lifecycle.inject is None:  # the client leaving is the whole fault
            self.leave_open()
            return
        report = recovery.send_fault(run, holder, faults.Watch(self.inflight))
        lifecycle.left(run, holder, report)
        if lifecycle.stops_holder:
            self.heal = recovery.Heal(holder, report, history, lifecycle)
        try:
            if lifecycle.leaves_once_moved:
                self.successor_streams()
            self.leave_open()
        except MissedAfterFault:
            raise
        except MissedWindow as missed:  # the fault was made: the deployment is not intact
            raise MissedAfterFault(str(missed)) from None

    def leave_open(self) -> None:
        """The client leaves the response, still open."""
        if self.inflight.finished:
            raise faults.ended_before(self.inflight, "before the client could leave it")
        self.closed_at = self.inflight.close()
        self.run.history.record_at("client_closed", self.closed_at, chunks=self.chunks())

    def successor_streams(self) -> None:
        deployment, case, settings, deadline, history = self.run.parts
        backend = deployment.backend
        survivors = [w for w in self.targets if w is not self.holder]
        successor = faults.find_holder(backend, survivors, self.inflight, deadline)
        proof = faults.prove_in_flight(
            backend, successor, self.inflight, self.chunks, topology(case.topology).fault_window,
            self.chunks() + settings.in_flight_tokens, "streamed content chunks", deadline,
        )  # fmt: skip
        history.record("moved_in_flight", worker=successor.name, how=proof.how)

    def await_end(self) -> None:
        """With the holder stalled, the frontend must not move what its client left; every
        worker that held the request must stop it, and a stalled one, running again, must be
        routed to again, before the counters are read; the client's stream ends."""
        deployment, _, settings, deadline, history = self.run.parts
        if self.heal is not None:
            watch = MoveWatch(deployment, self.counts_before, self.before, self.closed_at, settings)
            self.problems += watch.problems(self.heal, deadline, history)
            self.heal()
        self.problems += stop_problems(deployment, self.request, self.before, deadline, history)
        if self.heal is not None and self.holder is not None:  # running again, it must serve
            self.problems += recovery.rejoin_problems(
                deployment, self.holder, self.request, history, self.shape
            )
        inflight = self.inflight
        poll_until(lambda: (True if inflight.finished else None, "open"), deadline, "the client")
        record_response(inflight, history)

    def check(self) -> Verdict:
        deployment, case, _, deadline, history = self.run.parts
        backend, where = deployment.backend, topology(case.topology)
        expected = expected_outcome(
            where.fault_window, case.policy, self.run.lifecycle, where.request
        )
        counts = settled_counts(
            self.metrics_url, deployment.model_name, self.counts_before, expected,
            backend.migration_counts, deadline,
        )  # fmt: skip
        history.record("metrics_read", counts=counts.as_dict())
        problems = self.problems + count_problems(expected, counts, backend.migration_counts)
        problems += response_problems(self.inflight)
        response = self.inflight.response
        problems += delivered_problems(backend, case, self.shape, self.request, response)
        return Verdict(passed=not problems, reasons=problems, phase=history.phase)

    def aftermath(self) -> list[str]:
        """Every gauge at 0."""
        deployment, _, _, deadline, history = self.run.parts
        return recovery.idle_problems(deployment, self.metrics_url, deadline, history)


def delivered_problems(
    backend: Backend, case: Case, shape: Shape, request: Request, response: Response
) -> list[str]:
    """What the client read before it left must be true, as any response cut before its end
    (`evidence.checked_content`): the beginning of the backend's reference where it computes
    one, each worker's run unbroken where the tokens name their worker, and each token's
    log-probabilities where the backend judges them."""
    owed = evidence.owing(backend, request, shape, (backend.reference(case.api, shape), REFERENCE))
    return evidence.checked_content(request, response, owed, False, backend, lambda: None).problems


class MoveWatch:
    """With the holder stopped and its client gone, the frontend must not move the request.
    Its counters are read from the close until a reading that began once a move would show:
    the stream timeout after the close (the frontend's inactivity timer began at the stopped
    worker's last token, before it), then MOVE_SLOWER_BY times the frontend's slowest answer
    in the case: the time it took to count the close (an event it acts on, then a read of its
    counters), or any one read of its counters since, whichever is longer. The close must show
    first: until then the window is not known."""

    def __init__(
        self,
        deployment: Deployment,
        counts_before: metrics.MigrationCounts,
        before: Readings,
        closed_at: float,
        settings: Settings,
    ) -> None:
        assert deployment.model is not None
        self.metrics_url, self.model = deployment.base_url + "/metrics", deployment.model.name
        self.counts_before, self.closes_before = counts_before, before.frontend
        self.closed_at, self.timeout_s = closed_at, settings.stream_timeout_s
        #: The frontend's slowest answer so far, from the close until it counted the close,
        #: or over one read; None until the close is counted.
        self.slowest_s: float | None = None
        self.moved: metrics.MigrationCounts | None = None

    @property
    def until(self) -> float | None:
        """When a move would show at the latest (monotonic); None until the close shows."""
        if self.slowest_s is None:
            return None
        return self.closed_at + self.timeout_s + MOVE_SLOWER_BY * self.slowest_s

    def read(self, resume_by: float) -> tuple[bool | None, str]:
        """One reading of the frontend's counters: True once one shows a move, began at or
        after the watch's end, or finds that end past `resume_by`."""
        started = time.monotonic()
        text = metrics.scrape(self.metrics_url)
        answered = time.monotonic()
        moved = metrics.MigrationCounts.parse(text, self.model).since(self.counts_before)
        if moved.moves:
            self.moved = moved
            return True, str(moved)
        closes = frontend_closes(text)
        if self.slowest_s is None:
            if not all(closes[name] > self.closes_before[name] for name in closes):
                return None, f"the close not counted yet: {closes}"
            self.slowest_s = answered - self.closed_at
        self.slowest_s = max(self.slowest_s, answered - started)
        assert self.until is not None
        done = started >= self.until or self.until > resume_by
        return (True if done else None), f"no move; the slowest answer {self.slowest_s:.3f} s"

    def problems(self, heal: recovery.Heal, deadline: Deadline, history: History) -> list[str]:
        """Watch until the window has passed, within the time the stopped worker has before
        it must be resumed (`heal.resume_by`, inside its discovery lease); what it found."""
        stopped = f"{heal.holder.name} had to be resumed, inside its discovery lease"
        left_s = max(heal.resume_by - time.monotonic(), 0.0)
        try:
            poll_until(
                lambda: self.read(heal.resume_by), deadline.within(left_s),
                "the close to be counted and the window after it to pass",
            )  # fmt: skip
        except Timeout as exc:
            if self.until is not None:  # the case's own deadline came first
                raise
            return [
                f"the frontend never counted its client's close before {stopped}: whether it "
                f"would move the request cannot be judged ({exc})"
            ]
        if self.moved is not None:
            history.record("migration_seen", **self.moved.as_dict())
            return [
                f"the frontend moved a request whose client had left ({self.moved}): work for "
                f"nobody"
            ]
        assert self.until is not None and self.slowest_s is not None
        window_s = round(self.until - self.closed_at, 3)
        if self.until > heal.resume_by:
            return [
                f"a move would show only {window_s} s after the close, past the time {stopped}:"
                f" the frontend took up to {self.slowest_s:.3f} s to answer"
            ]
        history.record(
            "no_move_while_stopped", seconds=window_s, slowest_answer_s=round(self.slowest_s, 3),
            stream_timeout_s=self.timeout_s,
        )  # fmt: skip
        return []


def stop_problems(
    deployment: Deployment,
    request: Request,
    before: Readings,
    deadline: Deadline,
    history: History,
) -> list[str]:
    """Every worker that logged the request, and is alive, stops it within `STOP_BOUND_S`
    (`await_stopped`). The last of them, which held it when the client left, logs its end and
    why (`ending_problems`), and the cancellation counters agree (`cancellation_problems`)."""
    rid = str(request.request_id)
    held = worker_logs.received(deployment.workers, {rid}).get(rid, [])
    alive = [w for w in deployment.workers if w.name in held and w.process.exit_code() is None]
    if not alive:
        return [f"no live worker logged the request {rid}: who held it when its client left?"]
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
    last = next((w for w in alive if w.name == held[-1]), None)
    if last is None:
        return [f"{held[-1]}, which held the request last, is gone: nothing to judge"]
    problems, rises = ending_problems(last, rid, deadline, history)
    counted = cancellation_problems(deployment, held, last, rises, before, deadline, history)
    return problems + counted


def ending_problems(
    last: Worker, rid: str, deadline: Deadline, history: History
) -> tuple[list[str], int]:
    """The worker that held the request last logs its end and why (`CANCELLED`, `UNSENT` or
    both); what is wrong, and by how much its cancellation counter must have risen."""
    found = ended_because(last, rid, deadline)
    history.record("request_ended", worker=last.name, logged=sorted(found or ()))
    if found is None:
        return [f"{last.name} never logged {ENDED!r} for the request {rid}"], 0
    problems = []
    if not found:
        problems.append(
            f"{last.name} ended the request {rid} without logging {CANCELLED!r} or {UNSENT!r}"
        )
    return problems, 1 if CANCELLED in found else 0


def cancellation_problems(
    deployment: Deployment,
    held: list[str],
    last: Worker,
    rises: int,
    before: Readings,
    deadline: Deadline,
    history: History,
) -> list[str]:
    """The last holder's cancellation counter rose by `rises`, no other worker's moved, and
    each of the frontend's `CLOSE_COUNTERS` rose by exactly one."""
    # Every live worker that was counted before, or held the request: a successor started
    # after the fault that never held it may not answer yet, and took nothing.
    counted = [
        w
        for w in deployment.workers
        if w.process.exit_code() is None and (w.name in before.workers or w.name in held)
    ]
    after = Readings.take(deployment, counted, deadline)
    problems = []
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
    """Seconds from `since` until `worker` runs nothing: its handler's in-flight gauge at 0,
    and its engine's own running gauge at 0 where the backend names one (an engine that goes
    on decoding, its handler done, is caught there). A reading that fails, or an engine gauge
    the worker does not export, is unknown, and polled again."""
    backend = deployment.backend

    def probe() -> tuple[float | None, str]:
        try:
            held = backend.in_flight([worker])[worker.name]
            engine = backend.engine_running([worker])
        except metrics.Unanswered as exc:
            return None, str(exc)
        running = engine[worker.name] if engine is not None else 0.0
        seen = f"{held:g} in flight by its handler"
        if engine is not None:
            seen += f", {running:g} running in its engine ({backend.engine_running_gauge})"
        done = not held and not running
        return (time.monotonic() - since if done else None), seen

    return poll_until(probe, deadline.within(STOP_BOUND_S), f"{worker.name} to stop the request")


def ended_because(worker: Worker, rid: str, deadline: Deadline) -> set[str] | None:
    """Of `CANCELLED` and `UNSENT`, those the worker's log says of the request `rid` once it
    logs the request's end (within `STOP_BOUND_S`); None if it never does."""

    tail, entries = worker_logs.Tail(worker.process.log_path), []

    def probe() -> tuple[set[str] | None, str]:
        lines = tail.new_lines()
        if tail.restarted:
            entries.clear()
        entries.extend(line for line in lines if rid in line)
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
