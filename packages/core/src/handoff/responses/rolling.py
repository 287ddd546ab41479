"""A rolling restart under a steady load (the `rolling` topology), as an orchestrator rolls a
deployment: each worker of the target role in turn, once it holds a request young enough to
outlast the drain (`outlasting_window`), is drained (SIGTERM, then SIGKILL after the graceful
bound) while its replacement starts (`joining.Joiner`), and the next is drained only once the
frontend lists that replacement.
Meanwhile a client keeps the backend's `load_requests` requests in flight, sending a new one,
with a prompt of its own, as each ends.

Every request is then accounted for: it completes, its text the reference's where the backend
has one; the moves the frontend counted equal the hand-overs the workers' logs show (a request
received by k workers was handed over k - 1 times), and none failed; every replacement takes a
request of its own and serves it; every gauge falls to 0. A drained worker that held no request
(young enough) when its turn came proved nothing: not proven."""

from __future__ import annotations

import contextlib
import math
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

from handoff import continuity, metrics
from handoff.backend import Shape, Worker
from handoff.cases import Case, topology
from handoff.client import InFlight, Request
from handoff.deployment import Deployment
from handoff.errors import CaseFailure, HandoffError
from handoff.faults import HOLDER_TIMEOUT_S
from handoff.history import History
from handoff.lifecycle import of as lifecycle_of
from handoff.machine.polling import POLL_INTERVAL_S, Deadline, Timeout, poll_until
from handoff.machine.worker_logs import received
from handoff.policies import expected_outcome, known_defect
from handoff.responses import evidence, joining, load, recovery, waits
from handoff.verdict import Verdict

#: How much faster than its own speeds an engine may run before a request sent within
#: `outlasting_window` could end inside its drain.
OUTLAST_MARGIN = 1.5
#: Why a move may count as `new_request`: Dynamo 1.6.1 may count so the move of a request that
#: had streamed nothing when its worker was drained, or of one routed to a drained worker still
#: listed (docs/known-issues.md).
QUEUED_AS_NEW = (
    "a request that had streamed nothing when its worker was drained, or was routed to a "
    "drained worker still listed"
)


@dataclass
class SteadyLoad:
    """`count` requests kept in flight from `start()` until `stop()`, each new one of its own
    prompt (`Backend.shape` of the next variant) and `max_tokens`; every one sent is kept."""

    deployment: Deployment
    case: Case
    count: int
    max_tokens: int
    first_variant: int
    read_timeout_s: float
    sent: list[tuple[InFlight, Shape]] = field(default_factory=list)

    #: When each worker's drain began (its SIGTERM), by name.
    drained_at: dict[str, float] = field(default_factory=dict)
    #: When the frontend no longer listed each drained worker, by name.
    unlisted_at: dict[str, float] = field(default_factory=dict)
    #: When each drained worker was gone (its drain over, or SIGKILLed at the bound), by name.
    gone_at: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="steady-load", daemon=True)

    def start(self) -> None:
        self._top_up()
        self._thread.start()

    def _keep(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            self._top_up()

    def _top_up(self) -> None:
        open_now = sum(not inflight.finished for inflight, _ in self.sent)
        for _ in range(self.count - open_now):
            n = len(self.sent)
            shape = replace(
                self.deployment.backend.shape(self.case, self.first_variant + n),
                max_tokens=self.max_tokens,
            )
            request = Request(
                self.case.api, n % 2 == 0, self.deployment.model_name, shape.prompt,
                shape.max_tokens, str(uuid.uuid4()),
                top_logprobs=self.deployment.backend.top_logprobs(self.case),
                annotations=shape.annotations,
            )  # fmt: skip
            self.sent.append(
                (InFlight(self.deployment.base_url, request, self.read_timeout_s), shape)
            )

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():  # never started where its first top-up raised
            self._thread.join()

    def is_open(self) -> bool:
        return any(not inflight.finished for inflight, _ in self.sent)

    def open_ids(self) -> set[str]:
        return {str(i.request.request_id) for i, _ in self.sent if not i.finished}


class Rolling:
    """A steady load while every worker of the target role is rolled (`roll`), then every
    request accounted for: the exercise's workload (`responses.exercise`)."""

    #: Every worker of the role is struck, none the one a defect's witness would be read about.
    holder: Worker | None = None
    faulted: str | None = None

    def __init__(self, run: waits.CaseRun) -> None:
        deployment, case, _, deadline, history = run.parts
        self.run, self.defect = run, known_defect(case, run.deployment.pool.mix)
        self.shapes, _ = load.sized_shapes(deployment, case, run.variant, deadline, history)
        url = deployment.base_url + "/metrics"
        self.before = metrics.FrontendReading.read(url, deployment.model_name)
        self.steady = SteadyLoad(
            deployment, case, len(self.shapes), self.shapes[0].max_tokens,
            run.variant * len(self.shapes), deadline.remaining() + waits.CLIENT_GRACE_S,
        )  # fmt: skip
        self.replacements = ExitStack()

    def __enter__(self) -> Rolling:
        self.replacements.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.steady.stop()
        self.replacements.__exit__(*exc)

    def send(self) -> None:
        # The start of the load, as a load case's `requests_sent` (report.html draws its lanes).
        self.run.history.record(
            "requests_sent", steady=True, in_flight=len(self.shapes),
            max_tokens=self.shapes[0].max_tokens,
        )  # fmt: skip
        self.steady.start()

    def hold(self) -> None:
        """Nothing yet: each worker is held in its turn of the roll, chosen right before its
        drain (`holding`), as a replacement's start may take seconds."""

    def inject(self) -> None:
        """The roll, then the load kept on until every replacement has taken a request."""
        self.first_drain, self.unproven, self.joiners = roll(
            self.run, self.steady, self.replacements
        )
        await_taken(self.joiners, self.steady, self.run.deadline.within(HOLDER_TIMEOUT_S))
        self.steady.stop()

    def await_end(self) -> None:
        _, _, settings, deadline, history = self.run.parts
        await_every_response(self.steady, settings.graceful_bound_s, deadline, history)

    def check(self) -> Verdict:
        deployment, case, _, deadline, history = self.run.parts
        every = [inflight for inflight, _ in self.steady.sent]
        served = received(deployment.serving, {str(i.request.request_id) for i in every})
        verdict = judge_rolling(
            deployment, case, self.steady, served, self.before.counts, deadline, history
        )
        verdict.unproven += self.unproven
        for joiner in self.joiners:  # their probes end before every gauge must read 0
            problems, late = joiner.problems(every, self.steady.sent[0][1], served, history)
            verdict.reasons += problems + joiner.retire()
            verdict.unproven += late
        return verdict

    def aftermath(self) -> list[str]:
        deployment, _, _, deadline, history = self.run.parts
        url = deployment.base_url + "/metrics"
        return recovery.idle_problems(deployment, url, deadline, history, self.first_drain)


def roll(
    run: waits.CaseRun, steady: SteadyLoad, replacements: ExitStack
) -> tuple[float, list[str], list[joining.Joiner]]:
    """Each worker of the target role in turn: start its replacement; once the worker holds a
    young request, drain it; then wait until the frontend lists the replacement. When the first
    drain began, what was not proven, and the replacements."""
    deployment, case, settings, deadline, history = run.parts
    role = topology(case.topology).target_role
    targets = [w for w in deployment.workers if w.role == role]
    unproven: list[str] = []
    joiners: list[joining.Joiner] = []
    first_drain = None
    fresh_s = outlasting_window(deployment, case, steady.max_tokens, settings.graceful_bound_s)
    for worker in targets:
        # No probes: the steady load's new requests reach the replacement, and a probe could
        # meet the next drain and be moved beside the load's own hand-overs.
        replacing = joining.Joiner(
            deployment, role, history, None, steady.is_open, [worker.name], deadline
        )
        joiner = replacements.enter_context(joining.retired(replacing, history))
        joiners.append(joiner)
        # Chosen last, right before its SIGTERM: a replacement's start may take seconds.
        held = holding(worker, steady, fresh_s, deadline)
        if not held:
            sent = "" if fresh_s is None else f" sent within {fresh_s:.1f} s"
            unproven.append(
                f"{worker.name} held no request{sent} when its turn came "
                f"({HOLDER_TIMEOUT_S:g} s): its drain could move nothing"
            )
        first_drain = first_drain or time.monotonic()
        steady.drained_at[worker.name] = time.monotonic()
        watched = load.VictimWatch([load.Held(n, inflight) for n, inflight in enumerate(held)])
        fault = recovery.send_fault(run, worker, watched, holding=len(held))
        steady.gone_at[worker.name] = time.monotonic()
        run.lifecycle.left(run, worker, fault)
        # Until the frontend drops it, a request may be routed to it and moved; past the
        # lease bound of its SIGTERM the case fails.
        steady.unlisted_at[worker.name] = recovery.dropped_at(
            deployment, worker, steady.drained_at[worker.name], deadline, history
        )
        poll_until(
            lambda joiner=joiner: (joiner.listed_at, joiner.seen),
            deadline.within(settings.startup_timeout_s),
            f"the frontend to list {joiner.worker.name}, the replacement of {worker.name}",
        )
    assert first_drain is not None, "a rolling topology has workers of its target role"
    return first_drain, unproven, joiners


def await_taken(joiners: list[joining.Joiner], steady: SteadyLoad, deadline: Deadline) -> None:
    """Keep the load on until every replacement's log names a request of it (the last one is
    listed as the roll ends), or the deadline; one that took none is judged later."""

    def probe() -> tuple[bool | None, str]:
        ids = {str(i.request.request_id) for i, _ in list(steady.sent)}
        waiting = [j.worker.name for j in joiners if not received([j.worker], ids)]
        return (None if waiting else True), f"{waiting} took no request yet"

    with contextlib.suppress(Timeout):
        poll_until(probe, deadline, "every replacement to take a request of the load")


def outlasting_window(
    deployment: Deployment, case: Case, max_tokens: int, graceful_bound_s: float
) -> float | None:
    """How recently a request must have been sent for a drain to move it: one that old, were
    the engine `OUTLAST_MARGIN` times faster than its own speeds make it
    (`Backend.nominal_response_s`), still runs past the graceful bound. A request near its end
    finishes inside the drain and moves nothing. None where the backend does not know its
    speeds: any request held will do."""
    shape = replace(deployment.backend.shape(case, 0), max_tokens=max_tokens)
    nominal = deployment.backend.nominal_response_s(case, shape)
    if nominal is None:
        return None
    window = nominal / OUTLAST_MARGIN - graceful_bound_s
    if window <= 0:
        raise HandoffError(
            f"a rolling case's response of {max_tokens} tokens takes {nominal:.1f} s, too short "
            f"to outlast the graceful bound of {graceful_bound_s:g} s by {OUTLAST_MARGIN:g}x: "
            f"raise the backend's rolling max_tokens"
        )
    return window


def holding(
    worker: Worker, steady: SteadyLoad, fresh_s: float | None, deadline: Deadline
) -> list[InFlight]:
    """The open requests `worker`'s log names as received, once one of them was sent within
    `fresh_s` (any, where None); none if that does not come within HOLDER_TIMEOUT_S."""

    def probe() -> tuple[list[InFlight] | None, str]:
        mine = received([worker], steady.open_ids())
        held = [i for i, _ in steady.sent if str(i.request.request_id) in mine]
        now = time.monotonic()
        fresh = [i for i in held if fresh_s is None or now - i.sent_at <= fresh_s]
        seen = f"{len(steady.open_ids())} requests open, {len(held)} on {worker.name}"
        if fresh_s is not None:
            seen += f", {len(fresh)} of them sent within {fresh_s:.1f} s"
        return (held if fresh else None), seen

    try:
        return poll_until(probe, deadline.within(HOLDER_TIMEOUT_S), f"{worker.name} to hold one")
    except Timeout:
        return []


def await_every_response(
    steady: SteadyLoad, graceful_bound_s: float, deadline: Deadline, history: History
) -> None:
    """Every response ends within the bound the run's own rates allow: the slowest whole
    response seen so far, `waits.RESPONSE_SLOWER_BY` times slower, after a drain's graceful
    bound, and `waits.RESPONSE_FIXED_S` for the moves; one still open then fails as hung."""
    seen = [i.response.finished_at - i.sent_at for i, _ in steady.sent if i.response.finished_at]
    if not seen:
        raise CaseFailure("no request ended during the restart: nothing to bound the rest by")
    slowest = max(seen)
    bound_s = waits.RESPONSE_SLOWER_BY * slowest + graceful_bound_s + waits.RESPONSE_FIXED_S
    why = (
        f"{bound_s:.0f} s after the last drain: {waits.RESPONSE_SLOWER_BY:g}x the slowest of "
        f"{len(seen)} responses ({slowest:.1f} s), the graceful bound, and "
        f"{waits.RESPONSE_FIXED_S:g} s for the moves"
    )
    history.record("response_bound", seconds=round(bound_s, 1), why=why)

    def probe() -> tuple[bool | None, str]:
        still = [n for n, (i, _) in enumerate(steady.sent) if not i.finished]
        return (None if still else True), f"requests {still} open"

    try:
        poll_until(probe, deadline.within(bound_s), "every response to end")
    except Timeout:
        open_now = "; ".join(
            f"request {n}: {waits.last_token(i)}"
            for n, (i, _) in enumerate(steady.sent)
            if not i.finished
        )
        raise CaseFailure(f"hung: still open {why}: {open_now}") from None
    for n, (inflight, _) in enumerate(steady.sent):
        waits.record_response(inflight, history, request=n)


def judge_rolling(
    deployment: Deployment,
    case: Case,
    steady: SteadyLoad,
    served: dict[str, list[str]],
    before: metrics.MigrationCounts,
    deadline: Deadline,
    history: History,
) -> Verdict:
    """Each request with the evidence every request gets, cut where the logs show it handed
    over (`served`: the workers whose logs received each, in order); and the frontend's moves
    against the hand-overs, none failed."""
    problems, unproven, notes, handovers = judged_requests(
        deployment, case, steady, served, deadline, history
    )
    queued, rerouted = maybe_queued(steady, served), maybe_rerouted(steady, served)
    counts = waits.settled(
        deployment.base_url + "/metrics", deployment.model_name, before,
        lambda c: move_problems(c, handovers, queued, rerouted), deadline,
    )  # fmt: skip
    history.record("metrics_read", counts=counts.as_dict())
    history.record("load_accounted", requests=accounted(steady, served))
    history.record(
        "rolled", requests=len(steady.sent), handovers=handovers, queued=queued, rerouted=rerouted
    )
    problems += move_problems(counts, handovers, queued, rerouted)
    if counts.new_request and not problems:
        notes[f"{counts.new_request} hand-over(s) counted as new_request: {QUEUED_AS_NEW}"] = []
    return Verdict(
        passed=not problems,
        reasons=problems,
        phase="verdict",
        unproven=unproven + idle_drains(steady, served),
        notes=[
            f"requests {', '.join(map(str, ns))}: {note}" if ns else note
            for note, ns in notes.items()
        ],
    )


def judged_requests(
    deployment: Deployment,
    case: Case,
    steady: SteadyLoad,
    served: dict[str, list[str]],
    deadline: Deadline,
    history: History,
) -> tuple[list[str], list[str], dict[str, list[int]], int]:
    """Each request with the evidence every request gets (but the re-issued context, which a
    request moved by several drains has no one fault for: its text against the reference
    judges that where the backend has one), cut where the logs show it handed over, and only
    ever away from a drained worker; the problems, what could not be proven, the notes by
    request, the hand-overs."""
    backend = deployment.backend
    outcome = expected_outcome(
        topology(case.topology).fault_window, case.policy, lifecycle_of(case.fault)
    )
    problems: list[str] = []
    unproven: list[str] = []
    notes: dict[str, list[int]] = {}
    handovers = 0
    for n, (inflight, shape) in enumerate(steady.sent):
        request, workers = inflight.request, served.get(str(inflight.request.request_id), [])
        handovers += max(len(workers) - 1, 0)
        kind = "stream" if request.stream else "unary"
        label = f"request {n} ({kind}, id {request.request_id}, served by {', '.join(workers)})"
        baseline = replace(request, request_id=None)
        text = waits.reference_text(deployment, case.api, shape, baseline, deadline, history)
        found = evidence.judged(
            request, inflight.response, evidence.owing(backend, request, shape, text), outcome,
            case.policy, len(workers) > 1, backend, lambda: None,
        )  # fmt: skip
        found.problems += ["no worker's log names it"] if not workers else []
        found.problems += continuity.served_problems(
            found.runs, evidence.numbered(deployment, workers), found
        )
        found.problems += [
            f"handed over from {left}, which was never drained"
            for left in workers[:-1]
            if left not in steady.drained_at
        ]
        problems += [f"{label}: {p}" for p in found.problems]
        unproven += [f"{label}: {u}" for u in found.unproven]
        for note in found.notes:
            notes.setdefault(note, []).append(n)
    return problems, unproven, notes, handovers


def idle_drains(steady: SteadyLoad, served: dict[str, list[str]]) -> list[str]:
    """A drained worker no request was handed over from moved nothing: not proven."""
    left = {w for workers in served.values() for w in workers[:-1]}
    return [
        f"no request was handed over from {name}: its drain moved nothing"
        for name in steady.drained_at
        if name not in left
    ]


def maybe_queued(steady: SteadyLoad, served: dict[str, list[str]]) -> int:
    """The hand-overs of a request that had streamed no token when the worker it left began
    to drain: a unary request's (its tokens come at its end) or a stream's with none yet."""
    count = 0
    for inflight, _ in steady.sent:
        for left in served.get(str(inflight.request.request_id), [])[:-1]:
            at = steady.drained_at.get(left)
            chunks = [c.at for c in inflight.response.chunks if c.text]
            if not inflight.request.stream or at is None or not any(t < at for t in chunks):
                count += 1
    return count


def maybe_rerouted(steady: SteadyLoad, served: dict[str, list[str]]) -> int:
    """The requests that may have been routed to a drained worker still listed, refused
    unlogged, and moved once more: each sent to the frontend while one was listed whose log does
    not name it; and each hand-over away from a worker that was gone before the frontend was
    seen to drop it, whose re-issued request may have gone back to it (a race of the frontend's
    listing and the worker's end: Dynamo 1.6.1 counted such a move as a `new_request` too)."""
    count = 0
    for inflight, _ in steady.sent:
        workers = served.get(str(inflight.request.request_id), [])
        count += any(
            began <= inflight.sent_at <= steady.unlisted_at.get(name, began) and name not in workers
            for name, began in steady.drained_at.items()
        )
        count += sum(
            steady.gone_at.get(left, math.inf) < steady.unlisted_at.get(left, -math.inf)
            for left in workers[:-1]
        )
    return count


def move_problems(
    counts: metrics.MigrationCounts, handovers: int, queued: int, rerouted: int
) -> list[str]:
    """The frontend's moves against the hand-overs in the workers' logs: one move each, of
    either kind, `new_request` only for a hand-over of a request that had streamed nothing
    (`maybe_queued`); beyond them, at most one `new_request` for each request sent, or handed
    over, while a drained worker was still listed (`maybe_rerouted`); each move a success, none
    failed,
    none over the sequence cap."""
    problems = []
    if not handovers <= counts.moves <= handovers + rerouted or counts.ongoing_request > handovers:
        problems.append(
            f"the frontend counted {counts.moves} moves (ongoing_request "
            f"{counts.ongoing_request}, new_request {counts.new_request}); the workers' logs "
            f"show {handovers} hand-overs, and {rerouted} request(s) were sent, or handed over, "
            f"while a drained worker was still listed"
        )
    if counts.new_request > queued + counts.moves - handovers:
        problems.append(
            f"migration counter new_request = {counts.new_request}, but only {queued} "
            f"hand-over(s) were of a request that had streamed nothing when its worker drained"
        )
    wanted = {"succeeded": counts.moves, "failed": 0, "max_seq_len_exceeded": 0}
    seen = counts.as_dict()
    problems += [
        f"migration counter {name} = {seen[name]}, expected {want}"
        for name, want in wanted.items()
        if seen[name] != want
    ]
    return problems


def accounted(steady: SteadyLoad, served: dict[str, list[str]]) -> list[dict[str, object]]:
    """Each request's workers, in order, and how it ended: a load case's `load_accounted`."""
    rows = []
    for n, (inflight, _) in enumerate(steady.sent):
        workers = served.get(str(inflight.request.request_id), [])
        first = workers[0] if workers else None
        rows.append(load.accounted_row(n, first, workers, len(workers) > 1, inflight))
    return rows
