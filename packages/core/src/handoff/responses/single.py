"""One request (plain, guided, or of several choices): send it, fault the worker that holds it
in its window, wait for its end within a bound computed from the case, and judge it with the
evidence every request gets (responses.evidence) and the fault's aftermath
(`recovery.aftermath`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from handoff import faults, metrics
from handoff.backend import Backend, Shape, Worker
from handoff.cases import STOPS, Case, topology
from handoff.client import DEFAULT_SAMPLING, InFlight, Request, Sampling
from handoff.deployment import Deployment
from handoff.errors import CaseFailure
from handoff.history import History
from handoff.lifecycle import of as lifecycle_of
from handoff.machine import etcd
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.policies import expected_outcome, known_defect
from handoff.responses import evidence, recovery, stops, witnesses
from handoff.responses.pace import Pace, paced, response_bound_s
from handoff.responses.transfers import TransferProof
from handoff.responses.waits import (
    BASELINE,
    CLIENT_GRACE_S,
    RESPONSE_FIXED_S,
    RESPONSE_SLOWER_BY,
    CaseRun,
    FirstMigration,
    Settings,
    Silence,
    fault_wait,
    last_token,
    late_counts,
    proof_deadline,
    record_response,
    reference_text,
    settled_counts,
    undisturbed,
    undisturbed_prompt_tokens,
)
from handoff.verdict import Verdict, judge

#: The choices (`n`) a `choices` case asks for: more than one, which the frontend must not move.
CHOICES = 2
#: How often the frontend's /metrics is read, as a sign of life, while the response runs.
FRONTEND_CHECK_S = 1.0


@dataclass(frozen=True)
class Planned:
    """The case's request, sized to the engine's pace where the backend asks, and what it owes."""

    request: Request
    shape: Shape
    pace: Pace | None
    owed: evidence.Owed


@dataclass
class Sent:
    """The request in flight, where it is, and how far it had got when proven in flight."""

    inflight: InFlight
    sent_at: float
    targets: list[Worker]
    holder: Worker
    seen: int = 0
    proven_at: float = 0.0
    #: Problems of the topology's own proof made before the fault (the KV transfer).
    evidence: tuple[str, ...] = ()
    #: What the fault must land on while it is in its window, and the harness's lag measured
    #: on the way to it (`faults.require_room`).
    watch: faults.Watch | None = None
    lag_s: float = 0.0


#: How many times the HTTP layer's window the request a cut-off worker lost must outlast for
#: the race to show (`race_premise`).
RACE_REST_OVER_WINDOW = 1.5


class One:
    """One request of the case's kind as the exercise's workload (`responses.exercise`)."""

    holder: Worker | None = None
    faulted: str | None = None

    def __init__(self, run: CaseRun) -> None:
        """plan: the request, sized, and the text it owes; the frontend read before it."""
        deployment, case, settings, deadline, history = run.parts
        self.run, self.defect = run, known_defect(case, run.deployment.pool.mix)
        self.transfer = TransferProof(deployment, case, history, deadline)  # before any request
        self.planned = plan(
            deployment, case, deadline, history, run.variant, settings.in_flight_tokens
        )
        # Read now, so that only the case's own request counts, not the baseline's: the
        # frontend counts a prompt over --migration-max-seq-len when the request arrives.
        url = deployment.base_url + "/metrics"
        self.before = metrics.FrontendReading.read(url, deployment.model_name)
        # Chosen before the request is sent: reading every process's connections is slow.
        self.aimed_at = run.lifecycle.aim(deployment)

    def __enter__(self) -> One:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def send(self) -> None:
        self.inflight, self.sent_at = send_request(self.run, self.planned, self.transfer)

    def hold(self) -> None:
        self.sent = prove_held(
            self.run, self.planned, self.before, self.transfer, self.inflight, self.sent_at
        )
        self.holder = self.sent.holder

    def inject(self) -> None:
        run, sent = self.run, self.sent
        self.fault = send_with_room(run, self.planned, sent, self.aimed_at)
        # An engine's death is the fault, not its worker's exit, which the user waited for too.
        self.faulted_at = self.fault.engine_killed_at or time.monotonic()
        run.lifecycle.left(run, sent.holder, self.fault)
        race = witnesses.engine_reading(run.deployment.backend, sent.holder)
        raced = race if topology(run.case.topology).race else None
        self.heal = recovery.Heal(sent.holder, self.fault, run.history, run.lifecycle, raced)

    def await_end(self) -> None:
        await_end(self.run, self.planned, self.sent, self.before, self.heal, self.faulted_at)

    def check(self) -> Verdict:
        deployment, case, settings, deadline, history = self.run.parts
        found = judged(
            deployment, case, self.planned, self.sent, self.before, self.fault, deadline, history
        )
        found.unproven += race_premise(case, self.planned, self.sent, settings)
        return found

    def aftermath(self) -> list[str]:
        lifecycle, planned = self.run.lifecycle, self.planned
        struck = recovery.Struck(
            self.run, self.sent.holder, self.fault, self.heal, planned.request, planned.shape,
            self.faulted_at, lifecycle.outlives_lease,
        )  # fmt: skip
        return recovery.aftermath(lifecycle, struck)


def await_end(
    run: CaseRun,
    planned: Planned,
    sent: Sent,
    before: metrics.FrontendReading,
    heal: recovery.Heal,
    faulted_at: float,
) -> None:
    """The response over within its bound (`response_deadline`), and never silent past its
    silence bound (`silence_after`); a silent fault's holder healed once its move is seen."""
    deployment, case, settings, deadline, history = run.parts
    bounded, why = response_deadline(
        deployment.backend, case, planned, sent, settings, deadline, history
    )
    try:
        await_response(
            sent.inflight, deployment, before.counts, bounded, history,
            heal if run.lifecycle.heals_on_move else None,
            silence_after(case, sent, settings, faulted_at, history),
        )  # fmt: skip
    except Timeout as exc:
        if not why or deadline.expired():
            raise
        reading = f"{last_token(sent.inflight)}; ({exc})"
        raise CaseFailure(f"hung: the response was still open {why}: {reading}") from None
    record_response(sent.inflight, history)


def send_with_room(
    run: CaseRun, planned: Planned, sent: Sent, aimed_at: list[etcd.Member]
) -> faults.FaultReport:
    """The case's fault (`send_fault`); a drain only with its room (`faults.require_room`),
    and told whether the request still had the drain's wait left when its SIGTERM went out
    (`FaultReport.room_proven`): only a drain sent late may end in a missed window."""
    deployment, case, settings, _, history = run.parts
    if (wait_s := run.lifecycle.runs_on(settings)) is None:
        return send_fault(run, sent, aimed_at)
    left_s = time_left(deployment.backend, case, planned, sent)
    history.record("window_room", how=faults.require_room(left_s, wait_s, sent.lag_s, case.fault))
    checked_at = time.monotonic()
    fault = replace(send_fault(run, sent, aimed_at), lag_s=sent.lag_s)
    if left_s is None:
        return fault
    return replace(fault, room_proven=left_s - (fault.signalled_at - checked_at) >= wait_s)


def send_fault(run: CaseRun, sent: Sent, aimed_at: list[etcd.Member]) -> faults.FaultReport:
    """The case's fault on the holder of its request: a worker's, the broker's, or the
    discovery plane's (`responses.discovery_plane`, on the etcd members `aimed_at`)."""
    assert sent.watch is not None
    return recovery.send_fault(run, sent.holder, sent.watch, aimed_at)


def time_left(backend: Backend, case: Case, planned: Planned, sent: Sent) -> float | None:
    """How long the request has left now, at the faster of the pace its warm-ups measured and
    the backend's own (`Backend.nominal_response_s`); in a prefill window, what is left of the
    backend's KV transfer. None where neither is known. Not at the rate of the few frames
    before the proof: read in a burst, five frames once gave 1.2 s to 900 tokens' 5 s."""
    since_s = time.monotonic() - sent.proven_at
    if topology(case.topology).fault_window == "prefill":
        floor_s = backend.kv_transfer_floor_s(case)
        return None if floor_s is None else floor_s - (time.monotonic() - sent.sent_at)
    left = planned.shape.max_tokens - sent.seen
    estimates = [left / planned.pace.fastest] if planned.pace else []
    whole_s = backend.nominal_response_s(case, replace(planned.shape, max_tokens=left))
    start_s = backend.nominal_response_s(case, replace(planned.shape, max_tokens=0))
    if whole_s is not None and start_s is not None:
        estimates.append(whole_s - start_s)
    return min(estimates) - since_s if estimates else None


def streamed_rate(sent: Sent) -> float | None:
    """Tokens a second from the response's first content frame to its proof; None with fewer
    than two frames."""
    frames = [c.at for c in sent.inflight.response.chunks if c.text and c.at <= sent.proven_at]
    if len(frames) < 2 or frames[-1] <= frames[0]:
        return None
    return (len(frames) - 1) / (frames[-1] - frames[0])


def race_premise(case: Case, planned: Planned, sent: Sent, settings: Settings) -> list[str]:
    """Why the cut-off worker's race (cases.DECODE_RACE) could not show, if it could not: the
    request the worker lost must outlast the HTTP layer's window (twice the stream timeout)
    `RACE_REST_OVER_WINDOW` times at the fastest pace measured (the warm-up's, else the
    response's before the fault), as the cut-off worker decodes it a little faster than a
    worker that streams."""
    if not (topology(case.topology).race and cut_off(case)):
        return []
    rate = planned.pace.fastest if planned.pace else streamed_rate(sent)
    if rate is None:
        return ["the pace is unknown: too few tokens before the cut to tell whether the race "
                "could show"]  # fmt: skip
    rest_s = (planned.shape.max_tokens - sent.seen) / rate
    window_s = 2 * settings.stream_timeout_s
    if rest_s >= RACE_REST_OVER_WINDOW * window_s:
        return []
    return [
        f"the request the cut-off worker lost had {rest_s:.1f} s left at {rate:.0f} tokens/s, "
        f"under {RACE_REST_OVER_WINDOW:g} times the HTTP layer's {window_s:g} s window: the "
        f"race could not show"
    ]


#: The prompts a sampling case tries for one whose reference is decided (`decided`): one in six
#: of handoff's close model's prompts has a close call somewhere in 64 tokens.
SAMPLING_PROMPTS = 8
#: What a sampling topology's request asks for (cases.SAMPLINGS): penalties at the most the
#: frontend accepts (2), and a draw at temperature 1. Values that change the close model's
#: output within a few tokens of a move (handoff_vllm.sampling; docs/cases.md).
SAMPLED = {
    "frequency_penalty": Sampling(frequency_penalty=2.0),
    "presence_penalty": Sampling(presence_penalty=2.0),
    "repetition_penalty": Sampling(repetition_penalty=2.0),
    "seeded": Sampling(temperature=1.0, seed=7),
}


def plan(
    deployment: Deployment,
    case: Case,
    deadline: Deadline,
    history: History,
    variant: int,
    in_flight_tokens: int,
) -> Planned:
    """The case's request: its shape, its guide, choices or stop string by topology, sized to
    the engine's pace where the backend asks (`Backend.output_seconds`), and the text it owes.
    A guided request on an engine that decodes guides is first proven to keep its guide
    undisturbed. A stop string begins after the `in_flight_tokens` the client must see."""
    backend, where = deployment.backend, topology(case.topology)
    shape = backend.shape(case, variant)
    if where.request == "guided":
        shape = replace(shape, guide=backend.guide(case.api))
    if where.request in SAMPLED:
        shape = replace(shape, sampling=SAMPLED[where.request])
    request = Request(
        case.api, case.response == "stream", deployment.model_name, shape.prompt,
        shape.max_tokens, guide=shape.guide,
        choices=CHOICES if where.request == "choices" else 1,
        # Two choices' frames interleave in one stream, which the client reads as one text:
        # they owe no text (`evidence.NO_TEXT`), and no one choice's tokens are there to judge.
        top_logprobs=backend.top_logprobs(case) if where.request != "choices" else 0,
        annotations=shape.annotations, sampling=shape.sampling or DEFAULT_SAMPLING,
    )  # fmt: skip
    pace = None
    if (seconds := backend.output_seconds(case)) is not None:
        workers = len(deployment.workers)
        pace, shape = paced(
            deployment.base_url, request, workers, seconds, shape, deadline, history
        )
        request = replace(request, max_tokens=shape.max_tokens)
    if shape.sampling is not None:
        shape = decided(backend, case, shape, variant)
        request = replace(request, prompt=shape.prompt)
    if where.request in STOPS:
        planned_stop = stops.planned(backend, case.api, shape, in_flight_tokens, where.request)
        request = replace(request, stop=planned_stop)
    owed = evidence.NO_TEXT
    if request.choices == 1:
        text = reference_text(deployment, case.api, shape, request, deadline, history)
        if request.stop is not None:
            text = stops.owed_before(text, request.stop)
        owed = evidence.owing(backend, request, shape, text)
    if shape.guide is not None and backend.decodes_guides:
        guide_kept(deployment, request, owed, deadline, history)
    return Planned(request, shape, pace, owed)


def decided(backend: Backend, case: Case, shape: Shape, variant: int) -> Shape:
    """A sampling request's shape with the first prompt of its own `SAMPLING_PROMPTS` (the
    `variant`th such run: a pool's cases never share one) whose reference the backend's
    computation decides (`Backend.undecided`: no choice a close call), so that a case is not
    left unproven by its prompt's chance; the last tried where none is, which the verdict then
    reads as not proven."""
    tried = shape
    for other in range(variant * SAMPLING_PROMPTS, (variant + 1) * SAMPLING_PROMPTS):
        prompt = backend.shape(case, other).prompt
        tried = replace(shape, prompt=prompt)
        if backend.undecided(case.api, tried) is None:
            break
    return tried


def send_request(run: CaseRun, planned: Planned, transfer: TransferProof) -> tuple[InFlight, float]:
    """Send the request (a kv_transfer case's transfer settled first); when it went out."""
    deployment, case, _, deadline, history = run.parts
    request = planned.request
    transfer.settle()
    inflight = InFlight(
        deployment.base_url, request, read_timeout_s=deadline.remaining() + CLIENT_GRACE_S
    )
    sent_at = time.monotonic()
    history.record(
        "request_sent", api=case.api, stream=request.stream,
        prompt_tokens=planned.shape.prompt_tokens, max_tokens=request.max_tokens,
    )  # fmt: skip
    return inflight, sent_at


def prove_held(
    run: CaseRun,
    planned: Planned,
    before: metrics.FrontendReading,
    transfer: TransferProof,
    inflight: InFlight,
    sent_at: float,
) -> Sent:
    """Find the worker that holds the request by its own state, and prove it in its fault
    window (a stream by its chunks, a unary request by the tokens the frontend has received);
    a kv_transfer case proves its own transfer before the fault."""
    deployment, case, settings, deadline, history = run.parts
    backend, where, request = deployment.backend, topology(case.topology), planned.request
    targets = [w for w in deployment.workers if w.role == where.target_role]
    needed = settings.in_flight_tokens
    bounded, bound_s = proof_deadline(backend, case, planned.shape, planned.pace, needed, deadline)
    holder = faults.find_holder(backend, targets, inflight, deadline)
    history.record("holder_found", worker=holder.name, pid=holder.process.pid, proof_s=bound_s)
    transfer.count_early()
    metrics_url = deployment.base_url + "/metrics"
    if not frontend_counted(request):
        tokens_seen, what = (lambda: inflight.response.content_chunks), "streamed content chunks"
    else:
        model, start = deployment.model_name, before.output_tokens
        tokens_seen = lambda: metrics.frontend_output_tokens(metrics_url, model) - start  # noqa: E731
        what = "tokens received by the frontend"
        # Past the stop string's first token (the client sees none of it): every token the
        # frontend holds is in the re-issued context, so the move falls inside the match.
        needed += spanning(request)
    proof = faults.prove_in_flight(
        backend, holder, inflight, tokens_seen, where.fault_window, needed, what, bounded
    )
    how = proof.how
    if cut_late(case, backend):
        rest_s, response = settings.stream_timeout_s / 2, inflight.response
        how += "; then " + faults.await_last_seconds(
            inflight, lambda: response.streamed_tokens, request.max_tokens, rest_s, "tokens",
            deadline,
        )  # fmt: skip
    history.record("in_flight_proven", how=how, lag_s=round(proof.lag_s, 3))
    sent = Sent(inflight, sent_at, targets, holder, tokens_seen(), time.monotonic())
    sent.evidence = tuple(transfer.evidence())
    prefill = where.fault_window == "prefill"
    # Tokens counted one a frame, of one choice, with no stop string held back.
    counted = not prefill and request.stop is None and request.choices == 1
    whole = (tokens_seen, request.max_tokens) if counted else None
    sent.watch = faults.Watch(inflight, tokens_seen if prefill else None, whole)
    sent.lag_s = proof.lag_s
    return sent


def cut_late(case: Case, backend: Backend) -> bool:
    """Whether the fault lands in the response's last half stream timeout: a decode worker cut
    off decodes the request it lost to its end, deaf to the cancellation, and where the
    backend's re-issued request waits for that one to end (`reissue_waits_for_lost_request`),
    a request that must complete is cut so late that it has ended before the frontend moves
    it. The race case (cases.DECODE_RACE) cuts early, on purpose."""
    where = topology(case.topology)
    return (
        backend.reissue_waits_for_lost_request
        and cut_off(case)
        and where.target_role == "decode"
        and not where.race
        and expected_outcome(where.fault_window, case.policy, lifecycle_of(case.fault)).completes
    )


def cut_off(case: Case) -> bool:
    """Whether the case's fault leaves its holder running but unheard (a silent fault that
    does not stop it): a decode worker cut off decodes the request it lost to its end."""
    lifecycle = lifecycle_of(case.fault)
    return lifecycle.silent and not lifecycle.stops_holder


def frontend_counted(request: Request) -> bool:
    """Whether the request is proven in flight by the tokens the frontend received, not by the
    client's chunks: a unary response, and a stop request whose string begins before the
    fault: the frontend holds it back."""
    return not request.stream or spanning(request)


def spanning(request: Request) -> bool:
    return request.stop is not None and request.stop.spans


def response_deadline(
    backend: Backend,
    case: Case,
    planned: Planned,
    sent: Sent,
    settings: Settings,
    deadline: Deadline,
    history: History,
) -> tuple[Deadline, str]:
    """When the response must have ended, and why: the fault's own wait, then what the response
    has left `RESPONSE_SLOWER_BY` times slower than measured (after tokens: the rest at the rate
    before the proof; before the first: the whole response at the backend's own speed), and
    `RESPONSE_FIXED_S`; or, where the backend sized the output to its pace, the bound that pace
    gives from the sending, if sooner. Neither known: the case's own deadline."""
    shape, pace = planned.shape, planned.pace
    bound = response_bound_s(shape, pace) if pace else None
    bounded = deadline.within(bound) if bound else deadline
    why = ""
    if bound and pace:
        why = (
            f"{bound:.0f} s after it was sent, the bound its {shape.max_tokens} tokens at the "
            f"slowest measured {pace.slowest:.0f} tokens/s allow"
        )
    wait_s, waits_for = fault_wait(case, settings)
    rest = rest_of_response(case, planned, sent, backend)
    if rest is None:
        return bounded, why
    rest_s, what, basis = rest
    after_s = round(wait_s + RESPONSE_SLOWER_BY * rest_s + RESPONSE_FIXED_S, 1)
    history.record("response_bound", seconds=after_s, **basis)
    if after_s >= bounded.remaining():
        return bounded, why
    return deadline.within(after_s), (
        f"{after_s:.0f} s after the fault on {sent.holder.name}, the bound that {waits_for}"
        f"{what} allow"
    )


def silence_after(
    case: Case, sent: Sent, settings: Settings, faulted_at: float, history: History
) -> Silence | None:
    """How long a stream may stay quiet after its fault, from its own first token; none for a
    unary response, a stop request's (the frontend holds its string back to the end) or a
    fault before the first token (the whole response's bound holds)."""
    response = sent.inflight.response
    first = next((c.at for c in response.chunks if c.text and c.at <= faulted_at), None)
    request = sent.inflight.request
    if not request.stream or request.stop is not None or first is None:
        return None
    silence = Silence.after(case, settings, first - sent.sent_at, faulted_at)
    history.record("silence_bound", seconds=silence.seconds)
    return silence


def rest_of_response(
    case: Case, planned: Planned, sent: Sent, backend: Backend
) -> tuple[float, str, dict[str, float]] | None:
    """How long what the response has left after the fault takes, said how, and on what basis:
    after tokens, the rest at the rate before the proof; before the first token, the whole
    response again at the backend's own speed, where it knows it."""
    if sent.seen:
        rate = sent.seen / max(sent.proven_at - sent.sent_at, 1e-3)
        tokens = planned.shape.max_tokens - sent.seen
        basis = {"tokens_per_s": round(rate, 1)}
        return tokens / rate, f"{tokens} more tokens at {rate:.0f} tokens/s", basis
    if (whole_s := backend.nominal_response_s(case, planned.shape)) is not None:
        basis = {"whole_s": round(whole_s, 2)}
        return whole_s, f"the whole {whole_s:.1f} s response again", basis
    return None


def judged(
    deployment: Deployment,
    case: Case,
    planned: Planned,
    sent: Sent,
    before: metrics.FrontendReading,
    fault: faults.FaultReport,
    deadline: Deadline,
    history: History,
) -> Verdict:
    """The response and the frontend's counters against the policy, with the evidence every
    request gets; the counters read once more at the end."""
    backend, where = deployment.backend, topology(case.topology)
    metrics_url, model = deployment.base_url + "/metrics", deployment.model_name
    # Read now, before anything else reaches the frontend: the count rose when the request
    # arrived, by the prompt as the frontend tokenized it.
    prompt = metrics.FrontendReading.read(metrics_url, model).prompt_tokens - before.prompt_tokens
    expected = expected_outcome(
        where.fault_window, case.policy, lifecycle_of(case.fault), where.request
    )
    mode = backend.migration_counts
    counts = settled_counts(metrics_url, model, before.counts, expected, mode, deadline)
    history.record("metrics_read", counts=counts.as_dict())
    response = sent.inflight.response
    judges_usage = where.request == "usage"
    kept = evidence.checked_content(
        planned.request, response, planned.owed, expected.completes, backend,
        # A usage case judges usage.prompt_tokens as what the user is told: it is not read
        # as the re-issued context there (the other topologies read it so).
        lambda: None if judges_usage else evidence.migration_evidence(
            deployment, case, planned.request, sent.holder, response, prompt, counts.moves > 0,
            history, sent.seen if frontend_counted(planned.request) else 0,
        ),
    )  # fmt: skip
    if kept.problems or kept.notes or kept.unproven:
        history.record(
            "continuity_checked",
            problems=kept.problems,
            notes=kept.notes,
            unproven=kept.unproven,
        )
    found = [*sent.evidence, *kept.problems]
    found += late_counts(metrics_url, model, before.counts, counts, expected, mode, history)
    if judges_usage:
        alone = undisturbed_prompt_tokens(deployment, planned.request, deadline, history)
        told, unseen = evidence.usage_problems(response, alone, counts.ongoing_request > 0)
        found += told
        kept.unproven += [unseen] if unseen else []
    tokens, finish = planned.request.ends
    verdict = judge(
        expected, case.policy, response, counts, fault, tokens, mode, found, kept.unproven,
        finish,
    )  # fmt: skip
    verdict.notes = kept.notes
    verdict.witnessed = dict(kept.witnessed)
    return verdict


def guide_kept(
    deployment: Deployment,
    request: Request,
    owed: evidence.Owed,
    deadline: Deadline,
    history: History,
) -> None:
    """Before the fault, proof that the engine decodes the guide: the request undisturbed keeps
    it, and gives the reference where there is one. Else a refusal to move it would prove
    nothing of a guided request. A baseline is that request undisturbed already: it is not
    sent again."""
    if owed.compared_with == BASELINE:
        text, expected_text = str(owed.text), None
    else:
        text, expected_text = undisturbed(deployment, request, deadline, history), owed.text
    if problems := evidence.guided_problems(request, text, expected_text):
        raise CaseFailure(f"undisturbed, the guided request fails: {'; '.join(problems)}")
    history.record("guide_kept", characters=len(text))


def await_response(
    inflight: InFlight,
    deployment: Deployment,
    before: metrics.MigrationCounts,
    deadline: Deadline,
    history: History,
    heal: recovery.Heal | None = None,
    silence: Silence | None = None,
) -> None:
    """Wait for the response to end, noting when the frontend first counts a migration; from
    then on `heal` decides when the faulted worker is back (`recovery.Heal.after_move`). A
    stream quiet for longer than `silence` allows fails the case as hung."""
    metrics_url = deployment.base_url + "/metrics"
    migration = FirstMigration(metrics_url, deployment.model_name, before, history)
    checked = [time.monotonic()]

    def probe() -> tuple[bool | None, str]:
        if migration.seen is None or time.monotonic() - checked[0] > FRONTEND_CHECK_S:
            # Read until the migration shows, then once a second: a frontend that stops
            # answering while the client waits fails the case in seconds, by name.
            checked[0] = time.monotonic()
            migration.read()
        if migration.seen is not None and heal is not None:
            heal.after_move([inflight])
        if inflight.finished:
            return True, ""
        if silence and (hung := silence.broken(inflight.response, time.monotonic())):
            raise CaseFailure(hung)
        return None, inflight.response.summary()

    poll_until(probe, deadline, "the response to finish")
