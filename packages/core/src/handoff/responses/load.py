"""A load case: many requests at once, the fault on the worker that holds the most of them,
and every request accounted for: which worker held it, whether it was decoding or still queued
when the fault landed, how it ended, and what the frontend counted for all of them together."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import pairwise

from handoff import continuity, faults, metrics
from handoff.backend import Backend, Shape, Worker
from handoff.cases import BROKER, PAST_LEASE, SILENT, STALLS, Case, topology
from handoff.client import InFlight, Request
from handoff.deployment import Deployment
from handoff.errors import CaseFailure
from handoff.history import History, resumption_s
from handoff.machine.pace import Pace, paced
from handoff.policies import KNOWN_DEFECTS, Outcome, expected_outcome
from handoff.polling import Deadline, Timeout, poll_until
from handoff.responses import recovery, waits
from handoff.verdict import (
    Verdict,
    against_known_defect,
    completion_problems,
    count_problems,
    response_problems,
)

#: The frontend's gauge of requests it is serving: 0 once every request has ended.
FRONTEND_INFLIGHT = "dynamo_frontend_inflight_requests"
#: How long the gauges may take to fall to 0 after the last response ended.
GAUGE_SETTLE_S = 3.0
DECODING, QUEUED, UNKNOWN = "decoding", "queued", "decoding or queued"


@dataclass
class Held:
    """One request of a load case, as the case learns where it is."""

    n: int
    inflight: InFlight
    worker: str | None = None
    #: DECODING, QUEUED or UNKNOWN when the fault landed (`classify`).
    state: str = ""
    chunks_at_fault: int = 0
    #: The text it must give, where handoff knows it (`waits.reference_text`).
    text: str | None = None

    @property
    def request(self) -> Request:
        return self.inflight.request

    def label(self) -> str:
        kind = "stream" if self.request.stream else "unary"
        where = f", {self.state} on {self.worker}" if self.worker else ""
        return f"request {self.n} ({kind}, id {self.request.request_id}{where})"


class VictimWatch:
    """What `faults.inject` reads as the response: finished once any request the victim held
    has ended, which would put the fault past its window."""

    def __init__(self, held: list[Held]) -> None:
        self.held = held

    @property
    def finished(self) -> bool:
        return any(h.inflight.finished for h in self.held)


def exercise_load(
    deployment: Deployment,
    case: Case,
    settings: waits.Settings,
    deadline: Deadline,
    history: History,
    variant: int = 0,
) -> Verdict:
    """Send the backend's `load_requests` at once (streams and unary requests in turn, each
    prompt its own), fault the worker holding the most of them once every one is placed, and
    judge each request and the counters for all of them."""
    backend, where = deployment.backend, topology(case.topology)
    assert deployment.model is not None
    metrics_url, model = deployment.base_url + "/metrics", deployment.model.name
    shapes, pace = sized_shapes(deployment, case, variant, deadline, history)
    requests = [
        Request(case.api, n % 2 == 0, model, s.prompt, s.max_tokens, str(uuid.uuid4()))
        for n, s in enumerate(shapes)
    ]
    # Each baseline goes out with no id of its own: the workers' logs must name each load
    # request once, on the worker that took it.
    texts = [
        waits.reference_text(
            deployment, case.api, s, replace(r, request_id=None), deadline, history
        )
        for s, r in zip(shapes, requests, strict=True)
    ]
    compared_with = texts[0][1]
    counts_before = metrics.MigrationCounts.parse(metrics.scrape(metrics_url), model)
    read_timeout_s = deadline.remaining() + waits.CLIENT_GRACE_S
    held = [
        Held(n, InFlight(deployment.base_url, r, read_timeout_s), text=text)
        for n, (r, (text, _)) in enumerate(zip(requests, texts, strict=True))
    ]
    sent_at = time.monotonic()
    history.record(
        "requests_sent",
        requests=[{"n": h.n, "id": h.request.request_id, "stream": h.request.stream} for h in held],
        max_tokens=shapes[0].max_tokens,
    )
    targets = [w for w in deployment.workers if w.role == where.target_role]
    decoding_at_once = backend.decoding_at_once(case)
    place(held, backend, targets, decoding_at_once, settings.in_flight_tokens, deadline)
    proven_at = time.monotonic()
    victim = busiest(held, targets)
    victims = [h for h in held if h.worker == victim.name]
    if decoding_at_once is not None and len(victims) <= decoding_at_once:
        raise CaseFailure(
            f"{victim.name}, the busiest worker, held {len(victims)} requests and none queued "
            f"(it decodes {decoding_at_once} at once): the router spread them "
            f"{dict(Counter(h.worker for h in held))}"
        )
    classify(held, decoding_at_once)
    history.record(
        "requests_placed",
        requests=[
            {"n": h.n, "worker": h.worker, "state": h.state, "chunks": h.chunks_at_fault}
            for h in held
        ],
    )
    signalled_at = time.monotonic()
    fault = recovery.send_fault(
        case.fault,
        victim,
        VictimWatch(victims),
        settings,
        deadline,
        deployment.pool.nats,
        history,
        holding=len(victims),
    )
    recovery.record_fault(deployment, victim, fault, history)
    heal = recovery.Heal(victim, fault, history)
    if fault.response_done_at_kill or fault.finished_in_grace:
        ended = [h for h in victims if h.inflight.finished]
        if not handed_over_at_sigterm(
            fault, len(ended), metrics_url, model, counts_before, deadline
        ):
            raise CaseFailure(
                f"missed the fault window: {', '.join(h.label() for h in ended)} had ended "
                f"before {fault.signals[-1]} reached {fault.worker}, and the frontend counted "
                f"no move for them (raise the output length)"
            )
    # The broker's faults touch no worker: nothing any worker held is cut.
    cut = [] if case.fault in BROKER else victims
    bound_s, why = load_bound(
        held,
        case,
        settings,
        sent_at,
        proven_at,
        len(targets) - 1,
        decoding_at_once,
        pace.seconds_for(shapes[0].max_tokens)
        if pace
        else backend.nominal_response_s(case, shapes[0]),
    )
    history.record("response_bound", seconds=round(bound_s, 1), why=why)
    # A stall long enough for the queues (`waits.sized_for_queues`) outlives the worker's
    # discovery lease: it is healed only once the frontend has dropped it (`aftermath`).
    outlives_lease = (
        case.fault in STALLS and settings.stream_timeout_s >= recovery.DISCOVERY_LEASE_S
    )
    await_all(
        held,
        metrics_url,
        model,
        counts_before,
        deadline.within(bound_s),
        why,
        history,
        (heal, len(cut)) if case.fault in SILENT and not outlives_lease else None,
    )
    for h in held:
        waits.record_response(h.inflight, history, request=h.n)
    outcome = expected_outcome(where.fault_window, case.policy, case.fault)
    expected = expected_counts(outcome, len(cut), len(held))
    counts = waits.settled_counts(
        metrics_url, model, counts_before, expected, backend.migration_counts, deadline
    )
    history.record("metrics_read", counts=counts.as_dict())
    problems = []
    for h in held:
        problems += [
            f"{h.label()}: {p}"
            for p in request_problems(h, h in cut, outcome, case.policy, backend, compared_with)
        ]
    problems += unmoved(expected, counts, victim, len(cut))
    problems += count_problems(expected, counts, backend.migration_counts)
    problems += waits.late_counts(
        metrics_url, model, counts_before, counts, expected, backend.migration_counts, history
    )
    after = aftermath(
        deployment, case, victim, heal, held[0].request, outlives_lease, signalled_at, deadline,
        history,
    )  # fmt: skip
    served = received(targets, {h.request.request_id for h in held})
    history.record("load_accounted", requests=price(held, cut, signalled_at, served))
    verdict = Verdict(passed=not problems + after, reasons=problems + after, phase="verdict")
    verdict.notes = [
        f"every completed response's text compared with {compared_with}"
        if compared_with
        else f"content not compared: {backend.nondeterministic_because}"
    ]
    # A stall past the lease meets its defect; a reason the defect does not explain fails plainly.
    defect = KNOWN_DEFECTS.get(PAST_LEASE if outlives_lease else case.fault)
    return against_known_defect(verdict, defect)


def handed_over_at_sigterm(
    fault: faults.FaultReport,
    ended: int,
    metrics_url: str,
    model: str,
    before: metrics.MigrationCounts,
    deadline: Deadline,
) -> bool:
    """Whether the `ended` requests of a drained worker that were over before its SIGKILL were
    handed over at its SIGTERM, as the frontend's counters say: vLLM's worker with no grace
    period gives up its requests at once, and the frontend moves each (or refuses to, by its
    policy), counted as a move. Over with no move counted, they were over before the fault."""
    if fault.signals[0] != "SIGTERM":
        return False

    def probe() -> tuple[bool | None, str]:
        scraped = metrics.MigrationCounts.parse(metrics.scrape(metrics_url), model)
        moved = scraped.since(before).moves
        return (True if moved >= ended else None), f"{moved} moves counted"

    try:
        poll_until(
            probe,
            deadline.within(waits.METRICS_SETTLE_S),
            f"the frontend to count a move for each of the {ended} requests over after SIGTERM",
        )
    except Timeout:
        return False
    return True


def sized_shapes(
    deployment: Deployment, case: Case, variant: int, deadline: Deadline, history: History
) -> tuple[list[Shape], Pace | None]:
    """The shape of each of the backend's `load_requests`, each prompt its own; where the
    backend sizes its output by its pace on this machine (`Backend.output_seconds`), every one
    cut to what a warm-up of the first measures, and that pace."""
    backend = deployment.backend
    assert deployment.model is not None
    count = int(backend.setting("load_requests"))
    shapes = [backend.shape(case, variant * count + n) for n in range(count)]
    if (seconds := backend.output_seconds(case)) is None:
        return shapes, None
    first = shapes[0]
    warmup = Request(case.api, True, deployment.model.name, first.prompt, first.max_tokens)
    workers = len(deployment.workers)
    pace, sized = paced(deployment.base_url, warmup, workers, seconds, first, deadline, history)
    return [replace(s, max_tokens=sized.max_tokens) for s in shapes], pace


def aftermath(
    deployment: Deployment,
    case: Case,
    victim: Worker,
    heal: recovery.Heal,
    request: Request,
    outlives_lease: bool,
    stopped_at: float,
    deadline: Deadline,
    history: History,
) -> list[str]:
    """What the fault leaves once every response has ended: a healed worker serving again, the
    broker's refusal and recovery, every gauge at 0. A stall that outlived the worker's lease,
    proven by the frontend dropping it, leaves it unroutable on Dynamo 1.6.1 (the known defect
    of `stall_past_lease`); the worker is then retired so that its pool replaces it. `request`
    is what the probes of the deployment are made of (`recovery.short`)."""
    problems: list[str] = []
    if outlives_lease:
        recovery.await_unlisted(deployment, victim, stopped_at, history)
    if case.fault in SILENT:
        heal()
        problems += recovery.rejoin_problems(deployment, victim, request, history)
    if outlives_lease:
        recovery.retire(victim, deadline)
    if case.fault in BROKER:
        problems += recovery.broker_problems(deployment, case.fault, request, history)
    # A worker the fault ended (or `retire` did) has exited and is not asked for its gauge.
    gone = victim if victim.process.exit_code() is not None else None
    metrics_url = deployment.base_url + "/metrics"
    return problems + idle_problems(deployment, gone, metrics_url, deadline, history)


def received(workers: list[Worker], ids: set[str]) -> dict[str, list[str]]:
    """By request id, the workers whose logs say they received it, in the order they did (by
    their logs' timestamps): a request a worker has taken, whether it decodes it yet or not,
    and after a move the worker it moved to."""
    seen: dict[str, list[tuple[str, str]]] = {}
    for worker in workers:
        for stamp, request_id in continuity.receipts(worker.process.log_path):
            if request_id in ids:
                seen.setdefault(request_id, []).append((stamp, worker.name))
    return {request_id: [name for _, name in sorted(by)] for request_id, by in seen.items()}


def place(
    held: list[Held],
    backend: Backend,
    workers: list[Worker],
    decoding_at_once: int | None,
    in_flight_tokens: int,
    deadline: Deadline,
) -> None:
    """Wait until every request is placed by its worker's own state, and settled: one
    worker's log names it, each worker's in-flight gauge equals the requests its log names,
    (`Backend.in_flight`), and on each worker the streams with tokens (each with
    `in_flight_tokens` at least) and the
    streams with none are as many as its decoding slots and its queue allow. A request that
    ends first, or one that two workers name, fails the case."""
    ids = {h.request.request_id: h for h in held}

    def probe() -> tuple[bool | None, str]:
        if ended := [h.label() for h in held if h.inflight.finished]:
            raise CaseFailure(f"missed the fault window: {', '.join(ended)} ended before the fault")
        seen = received(workers, set(ids))
        if twice := {i: w for i, w in seen.items() if len(w) > 1}:
            raise CaseFailure(f"requests received by more than one worker before a fault: {twice}")
        try:
            gauges = backend.in_flight(workers)
        except metrics.Unanswered as exc:
            return None, str(exc)
        names = Counter(w[0] for w in seen.values())
        if len(seen) < len(held) or any(gauges[w] != names[w] for w in gauges):
            return None, f"{len(seen)} of {len(held)} requests in a worker's log; gauges {gauges}"
        for request_id, (worker,) in seen.items():
            ids[request_id].worker = worker
        unsettled = [
            worker
            for worker in gauges
            if not settled(
                [h for h in held if h.worker == worker], decoding_at_once, in_flight_tokens
            )
        ]
        return (None if unsettled else True), f"tokens not yet settled on {unsettled}"

    poll_until(probe, deadline.within(faults.HOLDER_TIMEOUT_S), "every request placed on a worker")


def settled(mine: list[Held], decoding_at_once: int | None, in_flight_tokens: int) -> bool:
    """Whether one worker's requests read as decoding or queued beyond doubt: every stream with
    tokens has `in_flight_tokens`, and neither kind of stream outnumbers its slots."""
    queue = max(len(mine) - decoding_at_once, 0) if decoding_at_once else 0
    streams = [h.inflight.response.content_chunks for h in mine if h.request.stream]
    started = [n for n in streams if n]
    return (
        all(n >= in_flight_tokens for n in started)
        and len(started) <= len(mine) - queue
        and len(streams) - len(started) <= queue
    )


def classify(held: list[Held], decoding_at_once: int | None) -> None:
    """Each request's state when the fault landed: a stream by its tokens then; a unary
    request, which shows none before its end, by what its worker's slots leave for it, or
    `UNKNOWN` where they leave room for either."""
    for h in held:
        h.chunks_at_fault = h.inflight.response.content_chunks
        if h.request.stream:
            h.state = DECODING if h.chunks_at_fault else QUEUED
    for worker in {h.worker for h in held}:
        mine = [h for h in held if h.worker == worker]
        queue = max(len(mine) - decoding_at_once, 0) if decoding_at_once else 0
        unary = [h for h in mine if not h.request.stream]
        queued_left = queue - sum(h.state == QUEUED for h in mine if h.request.stream)
        slots_left = len(mine) - queue - sum(h.state == DECODING for h in mine if h.request.stream)
        state = DECODING if queued_left <= 0 else QUEUED if slots_left <= 0 else UNKNOWN
        for h in unary:
            h.state = state


def busiest(held: list[Held], workers: list[Worker]) -> Worker:
    """The worker holding the most requests; of equals, the first."""
    holding = Counter(h.worker for h in held)
    return max(workers, key=lambda w: holding[w.name])


def load_bound(
    held: list[Held],
    case: Case,
    settings: waits.Settings,
    sent_at: float,
    proven_at: float,
    survivors: int,
    decoding_at_once: int | None,
    whole_s: float | None,
) -> tuple[float, str]:
    """How long after the fault every response must have ended: the fault's own wait, then
    every request's whole output again, `waits.RESPONSE_SLOWER_BY` times slower than the
    slowest stream decoding when it was placed, counted from the requests' sending (or the
    backend's own `whole_s`), in as many rounds as the surviving workers' decoding slots need,
    and `waits.RESPONSE_FIXED_S` for the moves."""
    wait_s, waits_for = waits.fault_wait(case.fault, case.plane, settings)
    max_tokens = held[0].request.max_tokens
    streams = [h for h in held if h.request.stream and h.state == DECODING]
    if streams:
        rate = min(h.chunks_at_fault for h in streams) / (proven_at - sent_at)
        whole_s, basis = max_tokens / rate, f"{rate:.0f} tokens/s, the slowest stream's"
    elif whole_s is not None:
        basis = "the backend's own speed"
    else:
        raise CaseFailure("no stream was decoding at the fault: nothing to bound the rest by")
    needed = waits.rounds(len(held), survivors, decoding_at_once)
    bound_s = wait_s + waits.RESPONSE_SLOWER_BY * needed * whole_s + waits.RESPONSE_FIXED_S
    why = (
        f"{bound_s:.0f} s after the fault, the bound that {waits_for}{needed} round(s) of "
        f"{max_tokens} tokens at {basis} on {survivors} surviving worker(s) allow"
    )
    return bound_s, why


def await_all(
    held: list[Held],
    metrics_url: str,
    model: str,
    before: metrics.MigrationCounts,
    deadline: Deadline,
    why: str,
    history: History,
    heal_at: tuple[Callable[[], None], int] | None = None,
) -> None:
    """Wait for every response to end, noting when the frontend first counts a migration; one
    still open at the bound fails the case as hung, naming it, its worker and its last token.
    `heal_at` (a heal and a number of requests): the heal is called once the frontend has
    counted that many moves, so that a silent worker comes back while the moved requests still
    stream from their successors."""
    migration = waits.FirstMigration(metrics_url, model, before, history)

    def probe() -> tuple[bool | None, str]:
        if migration.seen is None or (heal_at and migration.moves < heal_at[1]):
            migration.read()
            if heal_at and migration.moves >= heal_at[1]:
                heal_at[0]()
        still = [h.n for h in held if not h.inflight.finished]
        return (None if still else True), f"requests {still} open"

    try:
        poll_until(probe, deadline, "every response to end")
    except Timeout:
        still = "; ".join(
            f"{h.label()}: {waits.last_token(h.inflight)}" for h in held if not h.inflight.finished
        )
        raise CaseFailure(f"hung: still open {why}: {still}") from None


def expected_counts(outcome: Outcome, cut: int, sent: int) -> Outcome:
    """What the counters must rise by: each of the `cut` requests the faulted worker held moves
    (or fails to) as `outcome` says, queued or decoding alike (Dynamo 1.6.1 counts a request
    its worker had received, started or not, as `ongoing_request`); the sequence cap's counter
    counts each of the `sent` requests over the cap, as the frontend counts one when it
    arrives, cut or not."""
    moved = {name: n * cut for name, n in outcome.counts().items()}
    moved["max_seq_len_exceeded"] = outcome.max_seq_len_exceeded * sent
    return replace(outcome, **moved)


def unmoved(
    expected: Outcome, counts: metrics.MigrationCounts, victim: Worker, cut: int
) -> list[str]:
    """Where the fault must move its requests (or count the refusal) and the frontend counted no
    migration at all: said once, for the whole, beside each counter's own mismatch."""
    if not expected.ongoing_request + expected.new_request or counts.moves:
        return []
    return [
        f"the frontend counted no migration at all: {victim.name} held {cut} requests when faulted"
    ]


def request_problems(
    h: Held,
    was_cut: bool,
    outcome: Outcome,
    policy_name: str,
    backend: Backend,
    compared_with: str = waits.REFERENCE,
) -> list[str]:
    """One request against its promise: a request the fault cut ends as the policy says; any
    other completes whatever the policy. A complete response is whole (tokens, usage, one
    finish) and, where handoff knows its text (`Held.text`, `compared_with`), gives exactly
    that."""
    response, max_tokens = h.inflight.response, h.request.max_tokens
    if was_cut:
        problems = response_problems(outcome, policy_name, response, max_tokens)
    else:
        problems = completion_problems(response, max_tokens)
    if not problems and response.status == 200 and response.error is None:
        kept = continuity.check(
            response,
            max_tokens,
            backend.output_tokens,
            baseline=h.text,
            compared_with=compared_with,
            one_token_per_frame=backend.one_token_per_frame,
        )
        problems += kept.problems
    return problems


def idle_problems(
    deployment: Deployment,
    gone: Worker | None,
    metrics_url: str,
    deadline: Deadline,
    history: History,
) -> list[str]:
    """After the last response, the frontend's in-flight gauge and every surviving worker's
    must fall to 0 (a healed one's too; `gone`, the worker the fault ended, is not asked): a
    request still counted is one no client waits for. A gauge that cannot be
    read is unknown, and polled again; a frontend that exports none fails the case."""
    survivors = [w for w in deployment.workers if w is not gone]

    def probe() -> tuple[bool | None, str]:
        text = metrics.scrape(metrics_url)
        if FRONTEND_INFLIGHT not in text:
            raise CaseFailure(
                f"the frontend exports no {FRONTEND_INFLIGHT}: whether it still serves a "
                f"request is unknown"
            )
        try:
            gauges = deployment.backend.in_flight(survivors)
        except metrics.Unanswered as exc:
            return None, str(exc)
        gauges["the frontend"] = metrics.sample_sum(text, FRONTEND_INFLIGHT)
        busy = {name: value for name, value in gauges.items() if value}
        return (None if busy else True), f"in flight: {busy}"

    try:
        poll_until(probe, deadline.within(GAUGE_SETTLE_S), "every in-flight gauge at 0")
    except Timeout as exc:
        return [f"after every response ended: {exc}"]
    history.record("gauges_idle")
    return []


def price(
    held: list[Held], cut: list[Held], signalled_at: float, served: dict[str, list[str]]
) -> list[dict[str, object]]:
    """Each request's workers (`served`: those whose logs received it, in order), and what the
    loss cost each stream: the time from the fault's first signal to its first
    token after the longest pause that followed (`history.resumption_s`: for a request the fault
    cut, the migration's pause; for another, the disturbance), and its largest gap between
    tokens before the signal and after it."""
    rows = []
    for h in held:
        response = h.inflight.response
        row: dict[str, object] = {
            "n": h.n,
            "worker": h.worker,
            "workers": served.get(str(h.request.request_id), []),
            "cut": h in cut,
            "state": h.state,
            "stream": h.request.stream,
            "status": response.status,
            "failed": response.error is not None or response.exception is not None,
        }
        at = [c.at for c in response.chunks]
        if h.request.stream and at:
            resumed = resumption_s(at, signalled_at)
            gaps = list(pairwise(at))
            before = [b - a for a, b in gaps if b <= signalled_at]
            after = [b - a for a, b in gaps if a >= signalled_at]
            row["fault_to_next_token_ms"] = None if resumed is None else round(resumed * 1000, 1)
            row["largest_gap_before_ms"] = round(max(before) * 1000, 1) if before else None
            row["largest_gap_after_ms"] = round(max(after) * 1000, 1) if after else None
        rows.append(row)
    return rows
