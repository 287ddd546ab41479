"""A load case: many requests at once, the fault on the worker that holds the most of them,
and every request accounted for: which worker held it, whether it was decoding or still queued
when the fault landed, how it ended, and what the frontend counted for all of them together."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from itertools import pairwise

from handoff import continuity, faults, metrics
from handoff.backend import Backend, Shape, Worker
from handoff.cases import Case, topology
from handoff.client import InFlight, Request, Response
from handoff.deployment import Deployment
from handoff.errors import CaseFailure, MissedAfterFault
from handoff.history import History, resumption_s
from handoff.lifecycle import OFF_PATH
from handoff.lifecycle import of as lifecycle_of
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.machine.worker_logs import received
from handoff.policies import Outcome, expected_outcome, known_defect, past_lease_defect
from handoff.responses import evidence, joining, recovery, waits
from handoff.responses.pace import Pace, paced
from handoff.verdict import (
    Verdict,
    count_problems,
)

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
    owed: evidence.Owed = evidence.NO_TEXT

    @property
    def request(self) -> Request:
        return self.inflight.request

    def label(self) -> str:
        kind = "stream" if self.request.stream else "unary"
        where = f", {self.state} on {self.worker}" if self.worker else ""
        return f"request {self.n} ({kind}, id {self.request.request_id}{where})"


class VictimWatch:
    """What a lifecycle's injection reads as the response: finished once any request the victim held
    has ended, which would put the fault past its window."""

    def __init__(self, held: list[Held]) -> None:
        self.held = held

    @property
    def finished(self) -> bool:
        return any(h.inflight.finished for h in self.held)

    def outside(self, when: str) -> Exception | None:
        """Why a request the victim held left the fault's window `when` (`first_ended`)."""
        return first_ended(self.held, when)


def first_ended(held: list[Held], when: str) -> Exception | None:
    """Why a request of `held` is over `when`: one the system ended (an error, a short answer)
    before any that ended complete, which would only be the harness's missed window; None while
    every one is open."""
    ended = sorted(
        (h for h in held if h.inflight.finished), key=lambda h: faults.completed(h.inflight)
    )
    if not ended:
        return None
    return faults.ended_before(ended[0].inflight, f"{when} ({ended[0].label()})")


@dataclass
class Loaded:
    """The requests of a load case once sent, and what was read before them."""

    held: list[Held]
    before: metrics.FrontendReading
    sent_at: float
    targets: list[Worker]
    pace: Pace | None
    whole_s: float | None
    #: The first request's shape: the probes of the deployment are made of that request.
    first_shape: Shape

    def probe(self) -> tuple[Request, Callable[[], bool]]:
        """What a joiner's probes are made of, and whether a request of the load is still open."""
        return self.held[0].request, lambda: any(not h.inflight.finished for h in self.held)


class Load:
    """The backend's `load_requests` at once (streams and unary requests in turn, each prompt
    its own), the fault on the worker holding the most of them once every one is placed, and
    each request judged with the evidence every request gets, and the counters for all. In the
    `join` topology the faulted worker's replacement starts as the fault lands
    (`responses.joining`). The exercise's workload (`responses.exercise`)."""

    holder: Worker | None = None
    faulted: str | None = None

    def __init__(self, run: waits.CaseRun) -> None:
        self.run, self.defect = run, known_defect(run.case, run.deployment.pool.mix)
        self.stack = ExitStack()
        self.joiner: joining.Joiner | None = None

    def __enter__(self) -> Load:
        self.stack.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.__exit__(*exc)
        if exc[0] is None:  # every request judged: its lanes (report.html) drawn from this
            self.run.history.record("load_accounted", requests=self.accounted)

    def send(self) -> None:
        deployment, case, _, deadline, history = self.run.parts
        self.loaded = send_load(deployment, case, deadline, history, self.run.variant)

    def hold(self) -> None:
        deployment, case, settings, deadline, history = self.run.parts
        victim, self.victims, self.proven_at = hold_load(
            deployment, case, self.loaded, settings, deadline, history
        )
        self.holder, self.faulted = victim, victim.name

    def inject(self) -> None:
        run, victim, loaded = self.run, self.holder, self.loaded
        assert victim is not None
        deployment, case, settings, deadline, history = run.parts
        lifecycle = run.lifecycle
        if topology(case.topology).join:
            joining_worker = joining.Joiner(
                deployment, victim.role, history, *loaded.probe(), [victim.name], deadline
            )
            self.joiner = self.stack.enter_context(joining.retired(joining_worker, history))
        self.signalled_at = time.monotonic()
        watch = VictimWatch(self.victims)
        self.fault = recovery.send_fault(run, victim, watch, holding=len(self.victims))
        lifecycle.left(run, victim, self.fault)
        self.heal = recovery.Heal(victim, self.fault, history, lifecycle)
        cut = in_window(deployment, self.fault, self.victims, loaded.before.counts, deadline)
        # A stall long enough for the queues (`waits.sized_for_queues`) outlives the worker's
        # discovery lease: it is healed only once the frontend has dropped it (`aftermath`),
        # and meets that stall's known defect.
        self.outlives_lease = bool(lifecycle.past_lease) and (
            settings.stream_timeout_s >= recovery.DISCOVERY_LEASE_S
        )
        if self.outlives_lease:
            self.defect = past_lease_defect(lifecycle)
        # A fault off the response's path (the broker's) touches no worker: nothing is cut.
        self.cut = [] if lifecycle.meets == OFF_PATH else cut

    def await_end(self) -> None:
        healing = (self.heal, self.cut) if not self.outlives_lease else None
        await_load(self.run, self.loaded, self.proven_at, healing)

    def check(self) -> Verdict:
        deployment, case, _, deadline, history = self.run.parts
        loaded, victim = self.loaded, self.holder
        assert victim is not None
        ids = {str(h.request.request_id) for h in loaded.held}
        self.served = received(deployment.serving, ids)
        verdict = judge_load(
            deployment, case, loaded, victim, self.cut, self.served, deadline, history
        )
        if self.joiner:  # its probe ends before every gauge must read 0 (`aftermath`)
            problems, unproven = self.joiner.problems(
                [h.inflight for h in loaded.held], loaded.first_shape, self.served, history
            )
            verdict.reasons += problems + self.joiner.retire()
            verdict.unproven += unproven
        return verdict

    def aftermath(self) -> list[str]:
        loaded, victim = self.loaded, self.holder
        assert victim is not None
        struck = recovery.Struck(
            self.run, victim, self.fault, self.heal, loaded.held[0].request, loaded.first_shape,
            self.signalled_at, self.outlives_lease,
        )  # fmt: skip
        return recovery.aftermath(self.run.lifecycle, struck)

    @property
    def accounted(self) -> list[dict[str, object]]:
        return price(self.loaded.held, self.cut, self.signalled_at, self.served)


def await_load(
    run: waits.CaseRun,
    loaded: Loaded,
    proven_at: float,
    heal_cut: tuple[recovery.Heal, list[Held]] | None,
) -> None:
    """Wait for every response within the bound the case's rates allow (`load_bound`); a
    silent fault's worker healed once each request it held has moved (`await_all`)."""
    deployment, case, settings, deadline, history = run.parts
    bound_s, why = load_bound(
        loaded.held, case, settings, loaded.sent_at, proven_at, len(loaded.targets) - 1,
        deployment.backend.decoding_at_once(case),
        loaded.pace.seconds_for(loaded.held[0].request.max_tokens)
        if loaded.pace else loaded.whole_s,
    )  # fmt: skip
    history.record("response_bound", seconds=round(bound_s, 1), why=why)
    await_all(
        loaded.held, deployment, loaded.before.counts, deadline.within(bound_s), why, history,
        heal_cut if run.lifecycle.silent else None,
    )  # fmt: skip
    for h in loaded.held:
        waits.record_response(h.inflight, history, request=h.n)


def send_load(
    deployment: Deployment, case: Case, deadline: Deadline, history: History, variant: int
) -> Loaded:
    """Size the requests, learn the text each owes (each baseline goes out with no id of its
    own: the workers' logs must name each load request once, on the worker that took it), read
    the frontend, and send them all at once."""
    backend, where, model = deployment.backend, topology(case.topology), deployment.model_name
    shapes, pace = sized_shapes(deployment, case, variant, deadline, history)
    top = backend.top_logprobs(case)
    requests = [
        Request(
            case.api,
            n % 2 == 0,
            model,
            s.prompt,
            s.max_tokens,
            str(uuid.uuid4()),
            top_logprobs=top,
            annotations=s.annotations,
        )
        for n, s in enumerate(shapes)
    ]
    owed = []
    for s, r in zip(shapes, requests, strict=True):
        baseline = replace(r, request_id=None)
        text = waits.reference_text(deployment, case.api, s, baseline, deadline, history)
        owed.append(evidence.owing(backend, r, s, text))
    before = metrics.FrontendReading.read(deployment.base_url + "/metrics", model)
    read_timeout_s = deadline.remaining() + waits.CLIENT_GRACE_S
    held = [
        Held(n, InFlight(deployment.base_url, r, read_timeout_s), owed=o)
        for n, (r, o) in enumerate(zip(requests, owed, strict=True))
    ]
    sent_at = time.monotonic()
    history.record(
        "requests_sent",
        requests=[{"n": h.n, "id": h.request.request_id, "stream": h.request.stream} for h in held],
        max_tokens=shapes[0].max_tokens,
    )
    targets = [w for w in deployment.workers if w.role == where.target_role]
    whole_s = None if pace else backend.nominal_response_s(case, shapes[0])
    return Loaded(held, before, sent_at, targets, pace, whole_s, shapes[0])


def hold_load(
    deployment: Deployment,
    case: Case,
    loaded: Loaded,
    settings: waits.Settings,
    deadline: Deadline,
    history: History,
) -> tuple[Worker, list[Held], float]:
    """Place every request on its worker, settled, and pick the victim: the worker holding the
    most, which must hold some queued beyond its decoding slots. The victim, its requests, and
    when they were proven placed."""
    backend, held = deployment.backend, loaded.held
    decoding_at_once = backend.decoding_at_once(case)
    needed = settings.in_flight_tokens
    shape, pace = loaded.first_shape, loaded.pace
    placing, _ = waits.proof_deadline(backend, case, shape, pace, needed, deadline)
    place(held, backend, loaded.targets, decoding_at_once, needed, placing)
    proven_at = time.monotonic()
    victim = busiest(held, loaded.targets)
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
    return victim, victims, proven_at


def in_window(
    deployment: Deployment,
    fault: faults.FaultReport,
    victims: list[Held],
    before: metrics.MigrationCounts,
    deadline: Deadline,
) -> list[Held]:
    """The victim's requests the fault cut: all of them, but those over, complete, before a
    drain's last signal with no move counted for them at its SIGTERM
    (`handed_over_at_sigterm`): the drain let them finish, and they are judged as any request
    the fault spared. None left cut is a missed window; one that ended otherwise is judged
    with the rest."""
    if not (fault.response_done_at_kill or fault.finished_in_grace):
        return victims
    ended = [h for h in victims if spared(fault, h.inflight)]
    url, model = deployment.base_url + "/metrics", deployment.model_name
    if not ended or handed_over_at_sigterm(fault, len(ended), url, model, before, deadline):
        return victims
    if cut := [h for h in victims if h not in ended]:
        return cut
    raise MissedAfterFault(
        f"{', '.join(h.label() for h in ended)} had ended complete before {fault.signals[-1]} "
        f"reached {fault.worker}, every request it held, and the frontend counted no move"
    )


def spared(fault: faults.FaultReport, inflight: InFlight) -> bool:
    """A victim's request the drain let end complete, its end explained by the drain's own
    timing (not `FaultReport.blames`): a request the worker served on past its drain timeout
    stays cut, and is judged so."""
    ended_at = inflight.response.finished_at
    return (
        inflight.finished
        and faults.completed(inflight)
        and ended_at is not None
        and not fault.blames(ended_at)
    )


def judge_load(
    deployment: Deployment,
    case: Case,
    loaded: Loaded,
    victim: Worker,
    cut: list[Held],
    served: dict[str, list[str]],
    deadline: Deadline,
    history: History,
) -> Verdict:
    """Every request with the evidence every request gets (a cut one after its move with its
    re-issued context too), and the counters for all of them; read once more at the end.
    `served`: the workers whose logs received each request, in order."""
    backend = deployment.backend
    metrics_url, model, before = (
        deployment.base_url + "/metrics",
        deployment.model_name,
        loaded.before,
    )
    outcome = expected_outcome(
        topology(case.topology).fault_window, case.policy, lifecycle_of(case.fault)
    )
    expected, counts, raced_notes = load_counts(
        deployment, outcome, loaded, cut, served, deadline, history
    )
    mode = backend.migration_counts
    problems: list[str] = []
    unproven: list[str] = []
    notes: dict[str, list[int]] = {}
    for h in loaded.held:
        response = h.inflight.response

        def moved(h: Held = h, response: Response = response) -> continuity.Migration:
            prompt = each_prompt(loaded.held)
            return evidence.migration_evidence(
                deployment, case, h.request, victim, response, prompt, counts.moves > 0,
                history, request=h.n,
            )  # fmt: skip

        found = evidence.judged(
            h.request, response, h.owed, outcome, case.policy, h in cut, backend,
            moved if h in cut else lambda: None,
        )  # fmt: skip
        problems += [f"{h.label()}: {p}" for p in found.problems]
        unproven += [f"{h.label()}: {u}" for u in found.unproven]
        for note in found.notes:
            notes.setdefault(note, []).append(h.n)
    problems += unmoved(expected, counts, victim, len(cut))
    problems += count_problems(expected, counts, mode)
    problems += waits.late_counts(
        metrics_url, model, before.counts, counts, expected, mode, history
    )
    return Verdict(
        passed=not problems,
        reasons=problems,
        phase="verdict",
        unproven=unproven,
        notes=[f"requests {', '.join(map(str, ns))}: {note}" for note, ns in notes.items()]
        + raced_notes,
    )


def load_counts(
    deployment: Deployment,
    outcome: Outcome,
    loaded: Loaded,
    cut: list[Held],
    served: dict[str, list[str]],
    deadline: Deadline,
    history: History,
) -> tuple[Outcome, metrics.MigrationCounts, list[str]]:
    """What the counters must have risen by, what they rose by once settled, and the note of
    the queued-request race where it explains the difference (`counted_as_new`): only where
    no request the fault spared was served twice, so that a move of one of those (a stream
    timeout's) cannot pass for a cut request's count."""
    expected = expected_counts(outcome, len(cut), len(loaded.held))
    counts = waits.settled_counts(
        deployment.base_url + "/metrics", deployment.model_name, loaded.before.counts,
        expected, deployment.backend.migration_counts, deadline,
    )  # fmt: skip
    history.record("metrics_read", counts=counts.as_dict())
    spared = [h for h in loaded.held if h not in cut]
    once = all(len(served.get(str(h.request.request_id), [])) == 1 for h in spared)
    queued = sum(h.state == QUEUED for h in cut) if outcome.ongoing_request == 1 and once else 0
    expected, raced = counted_as_new(expected, counts, queued)
    if not raced:
        return expected, counts, []
    history.record("race_seen", race=QUEUED_COUNTED_NEW, requests=raced)
    return expected, counts, [f"race seen: {QUEUED_COUNTED_NEW}, {raced} of them"]


def each_prompt(held: list[Held]) -> int:
    """Each request's prompt as the frontend tokenized it: the case's prompts are of one length
    (`Backend.shape`), a request never re-issued says it in its usage, and one re-issued says
    it and the tokens its context carried: the least any says. (A request the fault did not cut
    may be re-issued too, by a second fault; a stream its client dropped says nothing.) Where
    none says it, it is unknown: the case fails, saying so."""
    said = [n for h in held if (n := (h.inflight.response.usage or {}).get("prompt_tokens"))]
    if not said:
        raise CaseFailure(
            "no request gives usage.prompt_tokens: each prompt's length, and so each "
            "re-issued context, is unknown"
        )
    return min(said)


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
        scraped = metrics.MigrationCounts.read(metrics_url, model)
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
        if ended := first_ended(held, "while the requests were placed"):
            raise ended
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
    wait_s, waits_for = waits.fault_wait(case, settings)
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
    deployment: Deployment,
    before: metrics.MigrationCounts,
    deadline: Deadline,
    why: str,
    history: History,
    heal_at: tuple[recovery.Heal, list[Held]] | None = None,
) -> None:
    """Wait for every response to end, noting when the frontend first counts a migration; one
    still open at the bound fails the case as hung, naming it, its worker and its last token.
    `heal_at` (a heal and the requests the worker held): once the frontend has counted a move
    of each, the heal decides when the silent worker comes back (`recovery.Heal.after_move`),
    while the moved requests still stream from their successors."""
    metrics_url = deployment.base_url + "/metrics"
    migration = waits.FirstMigration(metrics_url, deployment.model_name, before, history)

    def probe() -> tuple[bool | None, str]:
        if migration.seen is None or (heal_at and migration.moves < len(heal_at[1])):
            migration.read()
        if heal_at and migration.moves >= len(heal_at[1]):
            heal_at[0].after_move([h.inflight for h in heal_at[1]])
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
    its worker had received, started or not, as `ongoing_request`, but for a race:
    `counted_as_new`); the sequence cap's counter
    counts each of the `sent` requests over the cap, as the frontend counts one when it
    arrives, cut or not."""
    moved = {name: n * cut for name, n in outcome.counts().items()}
    moved["max_seq_len_exceeded"] = outcome.max_seq_len_exceeded * sent
    return replace(outcome, **moved)


#: Dynamo 1.6.1's race of a request queued on the worker a fault cuts (docs/known-issues.md).
QUEUED_COUNTED_NEW = "a queued request counted as new_request"


def counted_as_new(
    expected: Outcome, counts: metrics.MigrationCounts, queued: int
) -> tuple[Outcome, int]:
    """The expectation with as many of the `queued` cut requests counted as `new_request`
    instead of `ongoing_request` as the counters show, and how many: whether the frontend had
    the stream of a request its worker held unstarted when faulted is a race of Dynamo 1.6.1,
    either way a move of that request. Any other difference is left to fail."""
    shifted = counts.new_request - expected.new_request
    if not 0 < shifted <= queued or expected.ongoing_request - counts.ongoing_request != shifted:
        return expected, 0
    return replace(
        expected,
        ongoing_request=expected.ongoing_request - shifted,
        new_request=expected.new_request + shifted,
    ), shifted


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


def accounted_row(
    n: int, worker: str | None, workers: list[str], cut: bool, inflight: InFlight
) -> dict[str, object]:
    """What `load_accounted` says of every request: which worker held it first, the workers
    that received it in order, whether a fault cut it, and how it ended."""
    response = inflight.response
    return {
        "n": n,
        "worker": worker,
        "workers": workers,
        "cut": cut,
        "stream": inflight.request.stream,
        "status": response.status,
        "failed": response.error is not None or response.exception is not None,
    }


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
        workers = served.get(str(h.request.request_id), [])
        row = {**accounted_row(h.n, h.worker, workers, h in cut, h.inflight), "state": h.state}
        at = [c.at for c in h.inflight.response.chunks]
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
