"""The KV transfer of a `kv_transfer` case's own request, proven before its fault.

The requests a case sends before its own (a paced backend's warm-ups, a deterministic backend's
undisturbed baseline) each make a transfer of their own, and none of them may prove the case's:

- by timing (`Backend.kv_transfer_floor_s`): the frontend's time to first token over the first
  tokens it recorded since just before the case's request: exactly one, the request's own, no
  shorter than the least time the transfer takes;
- by a counter of completed transfers on the decode workers (`Backend.kv_transfer_counter`),
  which may count a transfer late (by more than a second on vLLM's CPU engine). Its reading
  before the case's request is taken only once it has settled: it counts a transfer for each
  earlier request, and then two readings further apart than its lag agree, so that no earlier
  transfer is still on its way into it. The lag is measured on the run: from the sending of the
  last earlier request to the answer of the first reading that counts its transfer. Past the
  settled reading, only the case's own transfer can raise it, and it is awaited for
  COUNT_SLOWER_BY times that lag.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from handoff import metrics
from handoff.cases import Case, topology
from handoff.deployment import Deployment
from handoff.errors import CaseFailure
from handoff.history import History
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.verdict import transfer_problems

#: The history events of the requests a case sends before its own, recorded as each is sent
#: (`machine.pace`, `responses.waits.undisturbed`): each makes a KV transfer.
EARLIER_REQUESTS = ("warmup_sent", "baseline_sent")
#: How much slower than the measured lag the case's own transfer may be counted, before its
#: fault: as the response's bound allows four times the measured pace
#: (`responses.waits.RESPONSE_SLOWER_BY`).
COUNT_SLOWER_BY = 4.0


@dataclass(frozen=True)
class Reading:
    """The decode workers' transfer count, and when (monotonic) it was asked and answered."""

    value: float
    asked: float
    answered: float


def decode_transfers(deployment: Deployment) -> float:
    """The decode workers' count of completed KV transfers (0 without a counter). Raises
    `metrics.Unanswered` while any does not answer: a total without one worker's history, read
    before the request, would let the next full reading "prove" a transfer."""
    counter = deployment.backend.kv_transfer_counter
    if counter is None:
        return 0.0
    ports = {w.name: w.ports["system"] for w in deployment.workers if w.role == "decode"}
    return sum(metrics.worker_sums(ports, counter).values())


def read(deployment: Deployment) -> Reading:
    """One reading of `decode_transfers`, timed."""
    asked = time.monotonic()
    value = decode_transfers(deployment)
    return Reading(value, asked, time.monotonic())


def lag_s(start: Reading, sent: list[float], readings: list[Reading]) -> float | None:
    """How long the counter took to count the earlier requests' transfers (`sent`: when each
    was sent, monotonic): from the last one's sending to the answer of the first reading that
    counts one more for each than `start` did. None before a reading does."""
    wanted = start.value + len(sent)
    first = next((r for r in readings if r.value >= wanted), None)
    return None if first is None else first.answered - max(sent)


def settled(readings: list[Reading], lag: float) -> Reading | None:
    """The latest reading, once every reading back to one answered more than `lag` before it
    was asked agrees with it: a transfer not yet counted at that earlier reading would have
    been counted by the latest. None until then."""
    latest = readings[-1]
    for earlier in reversed(readings[:-1]):
        if earlier.value != latest.value:
            return None
        if latest.asked - earlier.answered > lag:
            return latest
    return None


class TransferProof:
    """A case's KV transfer evidence, begun before any request of the case: the counter's
    reading then is what the earlier requests' transfers are counted from."""

    def __init__(
        self, deployment: Deployment, case: Case, history: History, deadline: Deadline
    ) -> None:
        backend = deployment.backend
        self.deployment, self.history, self.deadline = deployment, history, deadline
        wanted = topology(case.topology).proves_kv_transfer
        self.floor = backend.kv_transfer_floor_s(case) if wanted else None
        self.counter = backend.kv_transfer_counter if wanted and self.floor is None else None
        self.unproven = wanted and self.floor is None and self.counter is None
        self.wanted, self.done = wanted, False
        self.start = self.answered() if self.counter else None
        self.since = len(history.events)  # the case's requests are recorded after this
        self.before: Reading | None = None
        self.ttft_before = (0.0, 0.0)
        self.lag, self.settled_at = 0.0, 0.0

    def answered(self) -> Reading:
        """A reading of every decode worker, asked again while one does not answer."""
        awaited = "every decode worker's transfer count"
        return metrics.once_answered(lambda: read(self.deployment), self.deadline, awaited)

    @property
    def metrics_url(self) -> str:
        return self.deployment.base_url + "/metrics"

    def settle(self) -> None:
        """Just before the case's request is sent: what its own transfer is judged against."""
        if self.floor is not None:
            assert self.deployment.model is not None
            self.ttft_before = metrics.frontend_ttft(self.metrics_url, self.deployment.model.name)
        elif self.counter is not None:
            self.before, self.lag = self.settled_reading()
            self.settled_at = time.monotonic()

    def settled_reading(self) -> tuple[Reading, float]:
        """The counter once it counts every earlier request's transfer and has then held
        for longer than the lag that took (`lag_s`, `settled`), and that lag."""
        assert self.start is not None
        began, start, counter = time.monotonic(), self.start, self.counter
        events = self.history.events[self.since :]
        sent = [self.history.started + e.at for e in events if e.name in EARLIER_REQUESTS]
        if not sent:
            raise CaseFailure(
                f"no request of the case made a KV transfer before its own (no warm-up, no "
                f"baseline): how late {counter} counts one is unknown, so its reading at the "
                f"request may still lack one; the transfer is unproven"
            )
        readings: list[Reading] = []

        def probe() -> tuple[tuple[Reading, float] | None, str]:
            try:
                readings.append(read(self.deployment))
            except metrics.Unanswered as exc:
                return None, str(exc)
            lag = lag_s(start, sent, readings)
            seen = f"{counter} = {readings[-1].value:g} on the decode workers, "
            if lag is None:
                return None, seen + f"{start.value + len(sent):g} awaited"
            done = settled(readings, lag)
            return ((done, lag) if done else None), seen + f"its lag {lag:.2f} s"

        # Until the case's deadline: nothing measured yet says how late the counter may be.
        awaited = f"{counter} to count the transfers of the case's {len(sent)} earlier requests"
        try:
            before, lag = poll_until(probe, self.deadline, f"{awaited} and then hold")
        except Timeout as exc:
            raise CaseFailure(f"the KV transfer is unproven: {exc}") from None
        self.history.record(
            "kv_transfer_settled",
            counter=counter,
            transfers=before.value,
            earlier_requests=len(sent),
            lag_s=round(lag, 3),
            waited_s=round(time.monotonic() - began, 3),
        )
        return before, lag

    def count_early(self) -> None:
        """One read once a decode worker holds the request (its KV came first): the counter
        lives on the worker about to be faulted, and a busy vLLM CPU worker's /metrics took
        2.7 s to answer, so read here the fault can follow the in-flight proof at once. A
        counter that lags, or a worker that does not answer, is awaited after the proof."""
        if self.before is None:
            return
        try:
            total = decode_transfers(self.deployment)
        except metrics.Unanswered:
            return
        if total > self.before.value:
            self.counted(total)

    def counted(self, total: float) -> None:
        assert self.before is not None
        self.done = True
        transfers = total - self.before.value
        self.history.record("kv_transfer_checked", counter=self.counter, transfers=transfers)

    def evidence(self) -> list[str]:
        """After the in-flight proof, before the fault: the problems with the case's own
        transfer (none where it is proven, or where the topology asks for no proof)."""
        if not self.wanted or self.done:
            return []
        if self.unproven:
            name = self.deployment.backend.name
            return [f"backend {name!r} gives no KV transfer time or counter: unproven"]
        if self.floor is not None:
            return self.timing_problems(self.floor)
        return self.counter_problems()

    def timing_problems(self, floor: float) -> list[str]:
        """The first token's wait since the case's request against the transfer's floor."""
        assert self.deployment.model is not None
        total, count = metrics.frontend_ttft(self.metrics_url, self.deployment.model.name)
        first_tokens = count - self.ttft_before[1]
        ttft = (total - self.ttft_before[0]) / first_tokens if first_tokens == 1 else None
        self.history.record(
            "kv_transfer_checked",
            ttft_s=ttft,
            transfer_floor_s=round(floor, 4),
            first_tokens=first_tokens,
        )
        if first_tokens > 1:
            return [
                f"the frontend recorded {first_tokens:g} first tokens since the case's request "
                f"was sent, expected its one: the KV transfer is unproven"
            ]
        return transfer_problems(ttft, floor)

    def counter_problems(self) -> list[str]:
        """The counter must rise past its settled reading within COUNT_SLOWER_BY times its
        lag of the request's sending."""
        assert self.before is not None
        before, counter = self.before.value, self.counter

        def rose() -> tuple[float | None, str]:
            try:
                total = decode_transfers(self.deployment)
            except metrics.Unanswered as exc:
                return None, str(exc)
            seen = f"{counter} = {total:g} on the decode workers"
            return (total if total > before else None), seen

        wait_s = self.settled_at + COUNT_SLOWER_BY * self.lag - time.monotonic()
        try:
            total = poll_until(rose, self.deadline.within(wait_s), f"{counter} to rise")
        except Timeout as exc:
            return [
                f"no KV transfer counted before the fault: {exc} (from {before:g}, settled, "
                f"for {COUNT_SLOWER_BY:g} times its {self.lag:.2f} s lag)"
            ]
        self.counted(total)
        return []
