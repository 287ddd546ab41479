"""The KV-transfer proof of a kv_transfer case: before the fault, the case's own transfer was
made, by the known time it takes (the first token cannot come sooner) or by the decode workers'
transfer counter rising past its value at the request."""

from __future__ import annotations

from handoff import metrics
from handoff.cases import Case
from handoff.deployment import Deployment
from handoff.history import History
from handoff.polling import Deadline, Timeout, poll_until
from handoff.verdict import transfer_problems

#: The first token follows the transfer; its counter may lag the token. On two CPU cores shared
#: with vLLM's spinning NIXL threads it lagged by more than 1 s once (benchmarks/RESULTS.md); the
#: bound only costs time when the counter never rises.
TRANSFER_COUNT_WAIT_S = 5.0


def decode_transfers(deployment: Deployment) -> float:
    """The decode workers' count of completed KV transfers (0 without a counter). Raises
    `metrics.Unanswered` while any does not answer: a total without one worker's history, read
    before the request, would let the next full reading "prove" a transfer."""
    counter = deployment.backend.kv_transfer_counter
    if counter is None:
        return 0.0
    ports = {w.name: w.ports["system"] for w in deployment.workers if w.role == "decode"}
    return sum(metrics.worker_sums(ports, counter).values())


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
