"""What watching a faulted response needs, for one request or many: the case's knobs, how
long the frontend may rightly wait after a fault, what the client saw, and the frontend's
migration counters once they have settled."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from handoff import client, metrics
from handoff.backend import Backend, Shape
from handoff.cases import Case, topology
from handoff.client import InFlight, Request, Response
from handoff.deployment import Deployment
from handoff.errors import CaseFailure, HandoffError
from handoff.history import History
from handoff.lifecycle import Lifecycle
from handoff.lifecycle import of as lifecycle_of
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.policies import Outcome
from handoff.responses.pace import Pace, response_bound_s
from handoff.verdict import count_problems, late_count_problems

METRICS_SETTLE_S = 3.0

#: How far past the case's deadline the client keeps reading: the deadline, not the client's own
#: read timeout, must end a case whose response hangs. With the two equal, a loaded machine let
#: the client give up first, and a hang before the fault read as "the response ended before 5
#: streamed content chunks" (a transport error, `Read timed out`).
CLIENT_GRACE_S = 5.0

#: When a faulted response must have ended, counted from the fault: the wait the fault allows
#: (`fault_wait`), then what the response has left RESPONSE_SLOWER_BY times slower than
#: expected, and RESPONSE_FIXED_S for the migration itself. What it has left: after tokens, the
#: rest of them at the rate measured up to the in-flight proof (which counts the first token's
#: wait too); before the first token, the whole response at the backend's own speed, where it
#: knows it (`Backend.nominal_response_s`). Still open then, the case fails as hung.
RESPONSE_SLOWER_BY = 4.0

RESPONSE_FIXED_S = 5.0

#: How much slower than the backend's own speed a queued request may wait (`sized_for_queues`).
QUEUE_WAIT_SLOWER_BY = 3.0

#: Dynamo 1.6.1's request timeouts: a request sent to a worker that is gone fails over after
#: the TCP request timeout (about 5 s) or the NATS one (10 s) (docs/known-issues.md).
REQUEST_PLANE_TIMEOUT_S = {"tcp": 5.0, "nats": 10.0}

#: The frontend's inactivity timeout on a worker's response stream, in whole seconds. Unset,
#: Dynamo 1.6.1 keeps a stalled worker's stream open for as long as the stall lasts.
STREAM_TIMEOUT_ENV = "DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS"
#: The frontend's NATS request timeout in the broker's cases, in whole seconds: a new request
#: sent while the broker is down is refused once its attempts have timed out, after about 40 s
#: at Dynamo 1.6.1's default of 10 s (docs/known-issues.md).
NATS_TIMEOUT_ENV = "DYN_NATS_REQUEST_TIMEOUT_SECS"
BROKER_REQUEST_TIMEOUT_S = 2


@dataclass(frozen=True)
class Settings:
    """Knobs of a case run. The backend sizes each request to outlast the default graceful
    bound; a request that ends before its fault fails its case rather than passing."""

    in_flight_tokens: int = 5
    graceful_bound_s: float = 2.0
    stream_timeout_s: int = 3
    startup_timeout_s: float = 60.0
    keep_logs: bool = False


@dataclass(frozen=True)
class CaseRun:
    """One case as its exercise gets it: the live deployment, the case, its knobs, its deadline
    and its history; `variant` (the cases its pool served before) picks the prompt, so none
    finds another's prefix in a worker's cache."""

    deployment: Deployment
    case: Case
    settings: Settings
    deadline: Deadline
    history: History
    variant: int = 0

    @property
    def lifecycle(self) -> Lifecycle:
        return lifecycle_of(self.case.fault)

    @property
    def parts(self) -> tuple[Deployment, Case, Settings, Deadline, History]:
        return self.deployment, self.case, self.settings, self.deadline, self.history


def fault_wait(case: Case, settings: Settings) -> tuple[float, str]:
    """How long the frontend may rightly wait after the fault before the request has moved,
    and what for: the fault's own wait (`Lifecycle.wait`: the graceful bound of a drain;
    twice the stream timeout of a stall or a partition, the HTTP layer's, as the router gives
    up at once; the worker's drain timeout of an expired drain; the engine monitor's notice of
    an engine core's death; nothing for a kill), then, but for a silent fault, one
    request-plane timeout: the re-issued request may first reach a worker that is gone but
    still listed. A silent fault leaves none: its worker, the only one faulted, is quarantined
    by the timeout that moves the request (docs/known-issues.md)."""
    lifecycle = lifecycle_of(case.fault)
    wait_s, why = lifecycle.wait(settings)
    if lifecycle.silent:
        return wait_s, why
    plane_s = REQUEST_PLANE_TIMEOUT_S[case.plane]
    return wait_s + plane_s, f"{why}a {plane_s:g} s {case.plane} request timeout and "


@dataclass(frozen=True)
class Silence:
    """How long the client's reading of a stream may stay quiet after the fault: the wait the
    fault allows (`fault_wait`), the stream's own first token `RESPONSE_SLOWER_BY` times over
    (the new worker's first one comes after a prefill of the context again) and
    `RESPONSE_FIXED_S`. A hang shows as silence long before the whole response's bound
    (`single.response_deadline`), which allows for every token left."""

    fault_at: float
    seconds: float
    why: str

    @classmethod
    def after(cls, case: Case, settings: Settings, first_token_s: float, fault_at: float):
        wait_s, waits_for = fault_wait(case, settings)
        seconds = round(wait_s + RESPONSE_SLOWER_BY * first_token_s + RESPONSE_FIXED_S, 1)
        why = (
            f"{waits_for}its first token's {first_token_s:.2f} s {RESPONSE_SLOWER_BY:g} times "
            f"over, and {RESPONSE_FIXED_S:g} s"
        )
        return cls(fault_at, seconds, why)

    def broken(self, response: Response, now: float) -> str | None:
        """Why the stream counts as hung now, or None."""
        token_at = next((c.at for c in reversed(response.chunks) if c.text), self.fault_at)
        last = max(token_at, self.fault_at)
        if now - last <= self.seconds:
            return None
        since = "the fault" if last == self.fault_at else "its last token after the fault"
        return (
            f"hung: no token for {now - last:.0f} s since {since}, past its {self.seconds:g} s "
            f"silence bound: {self.why} ({response.summary()})"
        )


def sized_for_queues(case: Case, settings: Settings, backend: Backend) -> Settings:
    """`settings` with the stream timeout a load case needs: longer than any request waits
    queued on a worker, before the fault or behind the requests moved to it. Dynamo 1.6.1's
    timeout reads a queued request's wait as its worker's silence and moves it, a request of a
    healthy worker too (docs/cases.md). That wait is at most the rounds the surviving workers'
    slots need, less one, of whole responses at the backend's own speed, QUEUE_WAIT_SLOWER_BY
    times slower."""
    where = topology(case.topology)
    if not where.load or not lifecycle_of(case.fault).silent:
        return settings
    whole_s = backend.nominal_response_s(case, backend.shape(case, 0))
    if whole_s is None:
        raise HandoffError(
            f"backend {backend.name!r} gives no nominal response time (nominal_response_s): "
            f"the stream timeout of {case.key} cannot be sized above its queues"
        )
    survivors = backend.roles(case.topology).count(where.target_role) - 1
    needed = rounds(
        int(backend.setting("load_requests")), survivors, backend.decoding_at_once(case)
    )
    wait_s = QUEUE_WAIT_SLOWER_BY * max(needed - 1, 1) * whole_s
    return replace(settings, stream_timeout_s=max(settings.stream_timeout_s, math.ceil(wait_s)))


def rounds(requests: int, survivors: int, decoding_at_once: int | None) -> int:
    """How many rounds of whole responses the surviving workers' decoding slots need for
    `requests` (one round where a worker decodes all it holds at once)."""
    slots = max(survivors, 1) * (decoding_at_once or requests)
    return math.ceil(requests / slots)


def fault_env(case: Case, settings: Settings) -> dict[str, str]:
    """What bounds the fault's wait at the frontend (`Lifecycle.frontend_env`)."""
    return lifecycle_of(case.fault).frontend_env(settings)


#: What `reference_text` calls the text it gives.
REFERENCE, BASELINE = "the reference", "the undisturbed baseline"


def reference_text(
    deployment: Deployment,
    api: str,
    shape: Shape,
    request: Request,
    deadline: Deadline,
    history: History,
) -> tuple[str | None, str]:
    """The text `request` (of `shape`) must give, and what it is called: the backend's
    reference, computed by handoff; else, from a deterministic engine, an undisturbed baseline
    of the same request; else None."""
    backend = deployment.backend
    if (text := backend.reference(api, shape)) is not None:
        return text, REFERENCE
    if backend.deterministic:
        return undisturbed(deployment, request, deadline, history), BASELINE
    return None, ""


def undisturbed(
    deployment: Deployment, request: Request, deadline: Deadline, history: History
) -> str:
    """The text of the same request with no fault: what a deterministic engine must give
    again after the migration."""
    history.record("baseline_sent")
    response = Response()
    client.send(deployment.base_url, request, response, read_timeout_s=deadline.remaining())
    history.record("baseline_finished", response=response.summary())
    if response.status != 200 or response.error or response.exception:
        raise CaseFailure(f"the undisturbed baseline request failed: {response.summary()}")
    return response.text


def undisturbed_prompt_tokens(
    deployment: Deployment, request: Request, deadline: Deadline, history: History
) -> int:
    """What an undisturbed request of the same prompt is told of it (`usage.prompt_tokens`):
    the same request, unary, for one token, with no fault."""
    once = replace(request, stream=False, max_tokens=1, request_id=None)
    response = Response()
    client.send(deployment.base_url, once, response, read_timeout_s=deadline.remaining())
    told = (response.usage or {}).get("prompt_tokens")
    history.record("undisturbed_usage", prompt_tokens=told, response=response.summary())
    if response.status != 200 or response.error or response.exception or told is None:
        raise CaseFailure(f"the undisturbed request for its usage failed: {response.summary()}")
    return int(told)


def last_token(inflight: InFlight) -> str:
    """How long the client has waited since its last token, and what it has."""
    response = inflight.response
    if not response.chunks:
        return f"no token yet ({response.summary()})"
    quiet = time.monotonic() - response.chunks[-1].at
    return f"its last token came {quiet:.1f} s ago ({response.summary()})"


def late_counts(
    metrics_url: str,
    model: str,
    before: metrics.MigrationCounts,
    judged: metrics.MigrationCounts,
    expected: Outcome,
    mode: str,
    history: History,
) -> list[str]:
    """The counters once more, the last thing before teardown: any that moved since the
    reading the verdict uses fail the case (verdict.late_count_problems)."""
    final = metrics.MigrationCounts.read(metrics_url, model).since(before)
    history.record("metrics_reread", counts=final.as_dict())
    return late_count_problems(expected, judged, final, mode)


class FirstMigration:
    """The frontend's counters read while responses run, until they first show a move: that
    moment is recorded (`migration_seen`), once."""

    def __init__(
        self, metrics_url: str, model: str, before: metrics.MigrationCounts, history: History
    ) -> None:
        self.metrics_url, self.model, self.before, self.history = (
            metrics_url,
            model,
            before,
            history,
        )
        self.seen: metrics.MigrationCounts | None = None
        #: The moves (ongoing and new requests) the latest reading showed.
        self.moves = 0

    def read(self) -> bool:
        """Read the counters once; True when this reading is the first to show a move."""
        scraped = metrics.MigrationCounts.read(self.metrics_url, self.model)
        counts = scraped.since(self.before)
        self.moves = counts.moves
        if self.seen is not None or not self.moves:
            return False
        self.seen = counts
        self.history.record("migration_seen", **counts.as_dict())
        return True


def record_response(inflight: InFlight, history: History, **label: object) -> None:
    """What the client saw, at the times it saw it: headers, each chunk with its content, and
    how the response ended. `label` goes on each event: which of many requests it was."""
    response = inflight.response
    if response.headers_at is not None:
        history.record_at("response_headers", response.headers_at, status=response.status, **label)
    for n, chunk in enumerate(response.chunks, 1):
        finish = chunk.choice.get("finish_reason")
        extra = {"finish_reason": finish} if finish else {}
        history.record_at("chunk", chunk.at, n=n, text=chunk.text, **label, **extra)
    failed = response.error is not None or response.exception is not None
    ended = response.finished_at if response.finished_at is not None else time.monotonic()
    history.record_at(
        "response_finished", ended, failed=failed, response=response.summary(), **label
    )


def settled_counts(
    metrics_url: str,
    model: str,
    before: metrics.MigrationCounts,
    expected: Outcome,
    mode: str,
    deadline: Deadline,
) -> metrics.MigrationCounts:
    """What the frontend's counters rose by since `before` (the case's own request), once that
    agrees with the expectation, or as last seen at the bound (`settled`)."""
    return settled(
        metrics_url, model, before, lambda counts: count_problems(expected, counts, mode), deadline
    )


def settled(
    metrics_url: str,
    model: str,
    before: metrics.MigrationCounts,
    problems_of: Callable[[metrics.MigrationCounts], list[str]],
    deadline: Deadline,
) -> metrics.MigrationCounts:
    """What the counters rose by since `before`, once `problems_of` finds none in it, or as last
    seen at the bound. Counters are updated asynchronously to the response, so a reading taken
    the instant the client finished may lag; a wrong count still fails, with the value seen at
    the bound."""
    last: list[metrics.MigrationCounts] = []

    def probe() -> tuple[metrics.MigrationCounts | None, str]:
        scraped = metrics.MigrationCounts.read(metrics_url, model)
        last[:] = [scraped.since(before)]
        return (None if problems_of(last[0]) else last[0]), str(last[0])

    try:
        return poll_until(probe, deadline.within(METRICS_SETTLE_S), "migration counters")
    except Timeout:
        return last[0]


def proof_deadline(
    backend: Backend, case: Case, shape: Shape, pace: Pace | None, needed: int, deadline: Deadline
) -> tuple[Deadline, float | None]:
    """How long a proof may wait for `needed` tokens of a request of `shape`, and its seconds:
    `RESPONSE_SLOWER_BY` times what they take at the backend's own speed
    (`Backend.nominal_response_s`), and `RESPONSE_FIXED_S`; or the bound the measured `pace`
    gives them (`response_bound_s`); the case's deadline where neither is known (None). A
    deployment that never streams is named then, not at the case's deadline."""
    needing = replace(shape, max_tokens=needed)
    if pace is not None:
        bound_s = response_bound_s(needing, pace)
    elif (take_s := backend.nominal_response_s(case, needing)) is not None:
        bound_s = RESPONSE_SLOWER_BY * take_s + RESPONSE_FIXED_S
    else:
        return deadline, None
    return deadline.within(bound_s), round(bound_s, 1)
