"""After a fault that leaves the deployment running: a stalled or cut-off worker, healed, must
serve again; while the broker is down a new request must be refused as the migration path
says, and once it is back new requests must work. The single-request and the load cases both
judge these."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

import requests

from handoff import client, continuity, faults, metrics
from handoff.backend import Shape, Worker
from handoff.client import InFlight, Request, Response
from handoff.deployment import Deployment, silent
from handoff.errors import CaseFailure
from handoff.history import History
from handoff.lifecycle import Lifecycle
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.machine.worker_logs import receipts, received
from handoff.policies import SERVICE_UNAVAILABLE, refused_error
from handoff.responses import evidence
from handoff.responses.waits import BROKER_REQUEST_TIMEOUT_S, CaseRun, reference_text
from handoff.verdict import carries, completion_problems

#: How a worker that must serve again is named in what its probes find: one whose fault was
#: healed, or one that joined the case (`responses.joining`).
HEALED = "healed after its fault"
JOINED = "started as the fault landed"

#: How long a resumed worker may take to serve a request again: the frontend avoids a worker
#: that failed for about 5 s (docs/known-issues.md).
REJOIN_BOUND_S = 15.0
#: How long a stopped worker may stay listed by the frontend: on Dynamo 1.6.1 its file-store
#: lease ran out about 10 s after the stop (docs/known-issues.md).
LEASE_BOUND_S = 30.0
#: Dynamo 1.6.1's discovery lease: its file store drops a worker's entries once they are this
#: old (its keep-alive touches them every third of it). A stall longer than this may outlive it.
DISCOVERY_LEASE_S = 10.0
#: The latest a stalled worker is resumed once its move is counted, in seconds after its stop,
#: whether or not the successor has streamed: three quarters of the lease, so that its
#: keep-alive runs in time.
RESUME_BY_S = 0.75 * DISCOVERY_LEASE_S
#: The least time between the move being counted and the worker running again, however late
#: the move: within milliseconds of it the worker can miss the frontend's cancellation
#: (docs/known-issues.md, Dynamo issue 13088).
MOVE_SETTLE_S = 1.0
#: What the resumed worker is asked, one short request at a time, until it takes one.
REJOIN_TOKENS = 4
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


#: The frontend's gauge of requests it is serving: 0 once every request has ended.
FRONTEND_INFLIGHT = "dynamo_frontend_inflight_requests"
#: How long the gauges may take to fall to 0 after the last response ended.
GAUGE_SETTLE_S = 3.0


def send_fault(
    run: CaseRun, holder: Worker, watched: faults.Watched, aimed: Sequence[object] = (), **detail
) -> faults.FaultReport:
    """The case's fault (`CaseRun.lifecycle`) on `holder`, recorded as sent to what it
    signals; `watched` is what it must land before the end of, `aimed` the etcd members its
    lifecycle chose (`Lifecycle.aim`)."""
    lifecycle = run.lifecycle
    target = lifecycle.target(run, holder)
    run.history.record(
        "fault_sent", fault=lifecycle.name, signal=lifecycle.first_signal, worker=target.name,
        pid=target.pid, **detail,
    )  # fmt: skip
    return lifecycle.inject(run, holder, watched, aimed)


def stopped(run: CaseRun, holder: Worker, report: faults.FaultReport) -> None:
    run.history.record("worker_stopped", signals=list(report.signals))


def cut_off(run: CaseRun, holder: Worker, report: faults.FaultReport) -> None:
    assert report.cut is not None
    run.history.record("worker_cut_off", table=report.cut.table, rules=len(report.cut.flows))


def broker_faulted(run: CaseRun, holder: Worker, report: faults.FaultReport) -> None:
    run.history.record("broker_faulted", signals=list(report.signals))


def gone(run: CaseRun, holder: Worker, report: faults.FaultReport) -> None:
    """A worker the fault ended, replaced at once (`Deployment.replace`), as a real
    deployment's would be."""
    run.history.record("worker_gone", signals=list(report.signals))
    replaced(run, holder)


def engine_gone(run: CaseRun, holder: Worker, report: faults.FaultReport) -> None:
    """A worker whose engine was killed, which ended by itself, replaced at once."""
    run.history.record(
        "worker_exited", engine_pid=report.pid, exit_code=holder.process.exit_code(),
        after_engine_s=round(time.monotonic() - (report.engine_killed_at or 0.0), 3),
    )  # fmt: skip
    replaced(run, holder)


def replaced(run: CaseRun, holder: Worker) -> None:
    if successor := run.deployment.replace(holder):
        run.history.record("successor_started", worker=successor)


class Heal:
    """Heals a stalled or cut-off worker, once: SIGCONT, or the partition's rules removed.

    Once the frontend has moved what the worker held, the worker runs again as soon as each
    moved stream's successor has streamed a token (`after_move`), so that the rest is judged
    with the worker back (it must take no late token from it). Not sooner: run again within
    milliseconds of the move, it can miss the frontend's cancellation, decode the request it
    lost for seconds, while the request re-issued to the prefill worker makes no progress
    until the user's stream is closed (docs/known-issues.md); a successor that has streamed is
    past that. A race case (`race`) provokes it: a stalled worker runs again at the move, a
    cut-off one, which decodes what it lost all along, stays cut off until the end.
    Once the move is counted, it is back long before its discovery lease runs out
    (`RESUME_BY_S`): a stall that outlives it leaves Dynamo 1.6.1 never routing to the worker
    again; but never within `MOVE_SETTLE_S` of the move. Called again once the responses have
    ended, in case the frontend never counted the move: until then a stall stays a stall, so
    that a frontend that never moves it hangs."""

    def __init__(
        self,
        holder: Worker,
        report: faults.FaultReport,
        history: History,
        lifecycle: Lifecycle,
        race: Callable[[], float | None] | None = None,
    ) -> None:
        """Made as soon as the fault has taken effect: `RESUME_BY_S` counts from here. `race`:
        the race on purpose (cases.DECODE_RACE): a stall ends the instant the move is counted,
        a partition only once the responses have ended (healed, the worker would hear the
        cancellation and drop the request it lost); after the move, `race` reads the requests
        the worker's engine runs until one shows (`lost_request_running`: the race's witness,
        `policies.LOST_RAN_ON`)."""
        self.holder, self.report, self.history = holder, report, history
        self.silent, self.stops_holder = lifecycle.silent, lifecycle.stops_holder
        self.race = race
        self.lost_seen = False
        self.resume_by = time.monotonic() + RESUME_BY_S
        self.streamed_at_move: list[int] | None = None
        self.moved_at = 0.0
        self.done = False

    def after_move(self, moved: Sequence[InFlight]) -> None:
        """Called on every look at the responses the worker held, once the frontend has
        counted their moves."""
        if self.race:
            if self.stops_holder:
                self()
            self.look_for_lost(self.race)
            return
        now = time.monotonic()
        streamed = [inflight.response.content_chunks for inflight in moved]
        if self.streamed_at_move is None:
            self.streamed_at_move, self.moved_at = streamed, now
        successors_streamed = all(
            inflight.finished or (inflight.request.stream and chunks > at_move)
            for inflight, chunks, at_move in zip(
                moved, streamed, self.streamed_at_move, strict=True
            )
        )
        late = now >= max(self.resume_by, self.moved_at + MOVE_SETTLE_S)
        if not self.silent or successors_streamed or late:
            self()

    def look_for_lost(self, running: Callable[[], float | None]) -> None:
        """Once, the first time the worker's engine reports a request running after the move:
        the one it lost (the re-issued one waits at the prefill worker while it runs)."""
        if self.lost_seen or not (count := running()):
            return
        self.lost_seen = True
        self.history.record("lost_request_running", worker=self.holder.name, running=count)

    def __call__(self) -> None:
        if self.done:
            return
        dropped = self.report.cut.dropped() if self.report.cut else None
        faults.heal(self.holder, self.report)
        self.done = True
        self.history.record("worker_resumed", worker=self.holder.name, packets_dropped=dropped)


def broker_problems(struck: Struck, restart: bool) -> list[str]:
    """A broker fault's aftermath: the refusal while it is down, then the recovery once it is
    resumed (SIGCONT) or started again on its port (`restart`)."""
    deployment, request, history = struck.run.deployment, struck.request, struck.run.history
    problems = refusal_problems(deployment, request, history)
    return problems + recovery_problems(deployment, restart, request, history)


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
    before = metrics.MigrationCounts.read(metrics_url, model)
    response, sent_at = Response(), time.monotonic()
    client.send(deployment.base_url, short(request), response, read_timeout_s=bound_s)
    seconds = round(time.monotonic() - sent_at, 2)
    added = metrics.MigrationCounts.read(metrics_url, model).since(before)
    history.record(
        "refused_while_down", seconds=seconds, status=response.status, counts=added.as_dict()
    )
    problems = []
    # Every attempt failed: the migration path's 503; a policy that allows none refuses at the
    # first, as the release answers a refused move (`policies.refused_error`).
    limited = deployment.policy.migration_limit
    refused = SERVICE_UNAVAILABLE if limited else refused_error(SERVICE_UNAVAILABLE)
    if not carries(response, refused) or seconds > bound_s:
        problems.append(
            f"a new request sent while the broker was down must be refused with "
            f"{refused} within {bound_s:g} s ({attempts} attempt(s) of "
            f"{BROKER_REQUEST_TIMEOUT_S} s); after {seconds:g} s: {response.summary()}"
        )
    if (added.failed, added.succeeded) != (1, 0):
        problems.append(
            f"the request refused while the broker was down must count as one failed migration "
            f"and no success; the counters added {added.as_dict()}"
        )
    return problems


def recovery_problems(
    deployment: Deployment, restart: bool, request: Request, history: History
) -> list[str]:
    """The broker back (SIGCONT, or nats-server started again on its port), new requests must
    work again: short requests go out one at a time until one completes, within
    RECOVERY_BOUND_S; the time it took is in the history."""
    pool = deployment.pool
    if restart:
        pool.restart_nats()
    else:
        assert pool.nats is not None
        pool.nats.signal_tree(signal.SIGCONT)
    healed_at = time.monotonic()
    history.record("broker_healed", how="restarted" if restart else "SIGCONT")

    def completed(probe: Request, response: Response) -> tuple[bool | None, str]:
        return (True if response.status == 200 and response.error is None else None), ""

    try:
        _, sent = short_requests_until(
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
    deployment: Deployment,
    holder: Worker,
    request: Request,
    history: History,
    shape: Shape,
    who: str = HEALED,
    ended: Collection[str] = (),
) -> list[str]:
    """A resumed or healed worker (or one that joined: `who`, replacing the workers `ended`)
    must serve again: short requests go out one at a time until its log names one as
    received, within REJOIN_BOUND_S (none taken names it unroutable), and the one it took
    must pass the verdict as a case's own would (`served_problems`). `shape` (the case's)
    gives the backend's reference for it."""
    started = time.monotonic()
    owed = probe_reference(deployment, short(request), shape, history)
    url, model = deployment.base_url + "/metrics", deployment.model.name
    counts = [metrics.MigrationCounts.read(url, model)]

    def taken(probe: Request, response: Response) -> tuple[tuple | None, str]:
        """The probe, its response and the moves counted while it ran, once the holder took it."""
        counts.append(metrics.MigrationCounts.read(url, model))
        if probe.request_id not in received_ids(holder):
            return None, ""
        return (probe, response, counts[-1].since(counts[-2]).moves), ""

    try:
        (probe, response, moves), sent = short_requests_until(
            deployment, request, taken, REJOIN_BOUND_S, REJOIN_BOUND_S,
            f"{holder.name} to take a request again",
        )  # fmt: skip
    except Timeout as exc:
        return [unrejoined(deployment, holder, exc, who, ended)]
    problems = served_problems(deployment, holder, probe, response, moves, owed, who)
    history.record(
        "worker_rejoined", worker=holder.name, requests=len(sent), request_id=probe.request_id,
        response=response.summary(), moves=moves, problems=problems,
        seconds=round(time.monotonic() - started, 3),
    )  # fmt: skip
    return problems


def received_ids(worker: Worker) -> set[str]:
    """The request ids the worker's log names as received."""
    return {request_id for _, request_id in receipts(worker.process.log_path)}


def probe_reference(
    deployment: Deployment, probe: Request, shape: Shape, history: History
) -> evidence.Owed:
    """What a probe owes (`evidence.owing`): the backend's reference for the case's `shape` cut
    to the probe's length, else a deterministic backend's undisturbed baseline of the probe,
    else nothing (`waits.reference_text`); and the judge of its log-probabilities, which it
    asks for as the case's request does."""
    cut = replace(shape, max_tokens=probe.max_tokens)
    text = reference_text(deployment, probe.api, cut, probe, Deadline(REJOIN_BOUND_S), history)
    return evidence.owing(deployment.backend, probe, cut, text)


def served_problems(
    deployment: Deployment,
    holder: Worker,
    probe: Request,
    response: Response,
    moves: int,
    owed: evidence.Owed,
    who: str = HEALED,
) -> list[str]:
    """The request the worker took (healed, or one that joined: `who`), judged as a case's
    own: complete, at its full length, with no error frame (`verdict.completion_problems`), its
    text what it owes where that is known (`continuity.check`), each token's log-probabilities
    where the backend judges them (`evidence.told_logprobs`), and served by the worker alone: a
    request it failed that the frontend moved elsewhere completes too, but the frontend counts
    the move (`moves`, where known) and another worker of its role logs it."""
    backend = deployment.backend
    problems = completion_problems(response, REJOIN_TOKENS)
    if not problems:
        problems = continuity.check(
            response,
            REJOIN_TOKENS,
            backend.output_tokens,
            baseline=owed.text,
            why_no_baseline=backend.nondeterministic_because,
            compared_with=owed.compared_with,
            one_token_per_frame=backend.one_token_per_frame,
        ).problems
        problems += evidence.told_logprobs(probe, response, owed, backend, completed=True)
    if moves and not problems:
        problems.append(
            f"it completed, but the frontend counted {moves} migration(s) of it: "
            f"{holder.name} did not serve it to the end"
        )
    rid = str(probe.request_id)
    peers = [w for w in deployment.serving if w.role == holder.role]  # a prefill worker's too
    others = [w for w in received(peers, {rid}).get(rid, []) if w != holder.name]
    if others and not problems:
        problems.append(
            f"it completed, but {', '.join(others)} received it too: {holder.name} did not "
            f"serve it to the end"
        )
    said = f"{holder.name}, {who}, took a request and failed it: "
    return [said + problem for problem in problems]


def unrejoined(
    deployment: Deployment,
    holder: Worker,
    exc: Timeout,
    who: str = HEALED,
    ended: Collection[str] = (),
) -> str:
    """Why the healed holder was not served by: where the frontend also dropped workers that
    were never faulted, the deployment lost leases beyond the fault, and that is said first.
    One reading of the listing backs both."""
    never = "was never routed to again" if who == HEALED else "never took a request"
    code = holder.process.exit_code()
    state = "it still runs" if code is None else f"it ended with code {code}"
    failed = f"{holder.name}, {who}, {never} ({state}): {exc}"
    try:
        listing = deployment.listing()
    except (requests.RequestException, ValueError) as error:
        return f"{failed}; {silent(error)}"
    view = deployment.describe(listing)
    # The workers the case ended on purpose (`ended`: those a joiner replaced) are gone.
    unlisted = deployment.unlisted_in(listing[0])
    bystanders = [name for name in unlisted if name != holder.name and name not in ended]
    if not bystanders:
        return f"{failed}; {view}"
    return (
        f"the frontend dropped {', '.join(bystanders)}, never faulted: the deployment lost "
        f"discovery leases beyond the fault (a wall-clock step, or keep-alives starved), so "
        f"{holder.name}'s own rejoin is not what this judged; {failed}; {view}"
    )


def short(request: Request) -> Request:
    """The case's request as a probe of whether the deployment serves: unary, REJOIN_TOKENS
    long, and without the case's request id: a load case's request's id would have workers'
    logs name the probes as that request."""
    return replace(request, stream=False, max_tokens=REJOIN_TOKENS, request_id=None)


def short_requests_until(
    deployment: Deployment,
    request: Request,
    answered: Callable[[Request, Response], tuple[object | None, str]],
    bound_s: float,
    read_s: float,
    awaited: str,
) -> tuple[object, list[Response]]:
    """Send `request`, unary and REJOIN_TOKENS long, each time with a request id of its own
    (workers' logs name it), one at a time until `answered` (given each probe and its
    response) returns a result, within `bound_s`; that result, and every response sent.
    Timeout past it, naming the last response and what `answered` saw."""
    sent: list[Response] = []

    def probe() -> tuple[object | None, str]:
        probe_request = replace(short(request), request_id=str(uuid.uuid4()))
        sent.append(Response())
        client.send(deployment.base_url, probe_request, sent[-1], read_timeout_s=read_s)
        result, seen = answered(probe_request, sent[-1])
        detail = f"; {seen}" if seen else ""
        return result, f"{len(sent)} request(s), {sent[-1].summary()}{detail}"

    return poll_until(probe, Deadline(bound_s), awaited), sent


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

    try:
        dropped_at(deployment, holder, stopped_at, Deadline(LEASE_BOUND_S), history)
    except Timeout as exc:
        raise CaseFailure(
            f"the stall did not outlive {holder.name}'s discovery lease: still listed "
            f"{LEASE_BOUND_S:g} s after SIGSTOP ({exc})"
        ) from None


def dropped_at(
    deployment: Deployment,
    worker: Worker,
    since: float,
    deadline: Deadline,
    history: History,
    within_s: float = LEASE_BOUND_S,
) -> float:
    """When the frontend first lists no instance of `worker` (one of unknown instance ids is
    never unlisted), within `within_s` of `since` and `deadline`, recorded as `worker_unlisted`;
    Timeout past it. A listing of no instance at all proves nothing: Dynamo 1.6.1's /health
    lists none when it could not read its discovery (docs/known-issues.md)."""

    def probe() -> tuple[float | None, str]:
        try:
            listed, _ = deployment.listing()
        except (requests.RequestException, ValueError) as exc:
            return None, silent(exc)
        if not set().union(*listed.values()):
            return None, "no instance listed: the frontend read no discovery"
        if worker.name not in deployment.unlisted_in(listed):
            return None, f"{worker.name} listed"
        return time.monotonic(), ""

    left_s = since + within_s - time.monotonic()
    at = poll_until(probe, deadline.within(max(left_s, 0.0)), f"the frontend to drop {worker.name}")
    history.record("worker_unlisted", worker=worker.name, seconds=round(at - since, 3))
    return at


def retire(holder: Worker, deadline: Deadline) -> None:
    """SIGKILL a worker resumed after its lease ran out: Dynamo 1.6.1 never lists it again, so
    no later case of its pool may draw it; its pool replaces it as it replaces a killed one."""
    holder.process.signal_tree(signal.SIGKILL)
    if left := holder.process.wait_gone(deadline.within(faults.HOLDER_TIMEOUT_S)):
        raise CaseFailure(f"{holder.name} still alive after SIGKILL: {left}")


@dataclass
class Struck:
    """What a fault's aftermath is handed (`Lifecycle.aftermath`): the case, the worker it
    struck, its report and heal, the case's request and shape (what probes are made of:
    `short`), when it struck, and whether the stall outlived the worker's lease."""

    run: CaseRun
    holder: Worker
    report: faults.FaultReport
    heal: Heal
    request: Request
    shape: Shape
    faulted_at: float
    outlives_lease: bool = False

    def idle(self) -> list[str]:
        """Every gauge at 0 once every response ended (`idle_problems`)."""
        deployment = self.run.deployment
        return idle_problems(
            deployment, deployment.base_url + "/metrics", self.run.deadline, self.run.history,
            self.faulted_at,
        )  # fmt: skip


def healed_after(struck: Struck) -> list[str]:
    """A stalled or cut-off worker, healed, must serve again; a stall that outlived its lease,
    proven by the frontend dropping it, leaves it unroutable on Dynamo 1.6.1 (the known defect
    of `stall_past_lease`): it is then retired, so that its pool replaces it."""
    run, holder = struck.run, struck.holder
    if struck.outlives_lease:
        await_unlisted(run.deployment, holder, struck.faulted_at, run.history)
    struck.heal()
    problems = rejoin_problems(run.deployment, holder, struck.request, run.history, struck.shape)
    if struck.outlives_lease:  # a worker `retire` ended is not asked for its gauge
        retire(holder, run.deadline)
    return problems


def broker_resumed_after(struck: Struck) -> list[str]:
    return broker_problems(struck, restart=False)


def broker_restarted_after(struck: Struck) -> list[str]:
    return broker_problems(struck, restart=True)


def aftermath(lifecycle: Lifecycle, struck: Struck) -> list[str]:
    """The lifecycle's own aftermath, then every gauge at 0 (but where the lifecycle may end
    the frontend: `Lifecycle.idle_after`): no lifecycle can leave the gauges unchecked."""
    problems = lifecycle.aftermath(struck)
    return problems + struck.idle() if lifecycle.idle_after else problems


#: The roles whose engines decode, and may decode on after their handler let a request go (a
#: prefill engine hands its request over; the mocker's exports no running gauge).
DECODERS = ("aggregate", "decode")


def idle_problems(
    deployment: Deployment,
    metrics_url: str,
    deadline: Deadline,
    history: History,
    faulted_at: float | None = None,
) -> list[str]:
    """After the last response, the frontend's in-flight gauge, every surviving worker's, and
    the running gauge of each decoding one's engine where the backend names it (`DECODERS`: an
    engine may decode on after its handler let the request go) must fall to 0 (a healed one's
    too; one that exited, as a killed one, holds nothing): a request still counted is one no
    client waits for. A
    successor started after the fault (`faulted_at`) whose log names no request has taken
    none, and may still be starting: it is not asked. A gauge that cannot be read, or an
    engine's that is absent, is unknown, and polled again; a frontend that exports none fails
    the case."""
    survivors = [
        w
        for w in deployment.serving
        if w.process.exit_code() is None
        and (
            faulted_at is None
            or (w.process.started_at or 0.0) <= faulted_at
            or receipts(w.process.log_path)
        )
    ]

    # An engine exports its running gauge once it has run a request: asked of the workers that
    # decode and whose log names a request; one of them that exports none is unknown.
    decoders = [w for w in survivors if w.role in DECODERS and receipts(w.process.log_path)]

    def probe() -> tuple[bool | None, str]:
        text = metrics.scrape(metrics_url)
        if FRONTEND_INFLIGHT not in text:
            raise CaseFailure(
                f"the frontend exports no {FRONTEND_INFLIGHT}: whether it still serves a "
                f"request is unknown"
            )
        try:
            gauges = deployment.backend.in_flight(survivors)
            engines = deployment.backend.engine_running(decoders) or {}
        except metrics.Unanswered as exc:
            return None, str(exc)
        gauges |= {f"{name}'s engine": running for name, running in engines.items()}
        gauges["the frontend"] = metrics.sample_sum(text, FRONTEND_INFLIGHT)
        busy = {name: value for name, value in gauges.items() if value}
        return (None if busy else True), f"in flight: {busy}"

    try:
        poll_until(probe, deadline.within(GAUGE_SETTLE_S), "every in-flight gauge at 0")
    except Timeout as exc:
        return [f"after every response ended: {exc}"]
    history.record("gauges_idle")
    return []
