"""Open-loop load while workers die and are replaced: requests arrive at a fixed rate for a set
time on Dynamo's frontend and three mocker workers; on a schedule the worker with the most
requests in flight is SIGKILLed and a new one started. Prints the requests sent, completed,
failed with the migration path's error, and lost (neither: nothing may be), the latency p50/p99
of the requests before, during (in flight at a kill, or sent within RECOVERY_S after it) and
after the faults, and how long after each kill the completions per second were back to their
steady rate.

    .nox/tests/bin/python benchmarks/load_soak.py [--seconds 60] [--rate 4] [--kill-every 15]

Exit 1 when a request was lost.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from handoff import metrics
from handoff.backend import Backend, Worker
from handoff.cases import Case
from handoff.client import InFlight, Request
from handoff.deployment import Deployment
from handoff.history import percentile
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.plugins import configured_backend
from handoff.policies import SERVICE_UNAVAILABLE, policy
from handoff.word_tokenizer import prompt

CASE = Case.from_id("migration_enabled-worker_failure-chat-stream-nats")
ROLES = ("aggregate", "aggregate", "aggregate")
#: How long after the last arrival every request must have ended.
SETTLE_S = 60.0
#: Requests sent this soon after a kill count as sent during the fault.
RECOVERY_S = 5.0
#: A second's completions at this share of the steady rate count as recovered.
RECOVERED = 0.9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second")
    parser.add_argument("--kill-every", type=float, default=15.0)
    parser.add_argument("--tokens", type=int, default=200, help="output tokens a request")
    args = parser.parse_args()
    backend = configured_backend("mocker", {})
    folder = Path(tempfile.mkdtemp(prefix="handoff-soak-"))
    deployment = Deployment(backend, CASE, folder, policy(CASE.policy), ROLES)
    try:
        deployment.start(Deadline(120))
        started = time.monotonic()
        sent, kills = soak(deployment, args, started)
        with contextlib.suppress(Timeout):  # the requests still open then are lost, counted below
            poll_until(
                lambda: (True if all(r.finished for r in sent) else None, "requests open"),
                Deadline(SETTLE_S),
                "every request to end",
            )
        return report(sent, kills, args, started)
    finally:
        if problems := deployment.stop():
            print(f"teardown: {problems}")
        print(f"logs: {folder}")


def soak(
    deployment: Deployment, args: argparse.Namespace, started: float
) -> tuple[list[InFlight], list[tuple[float, str]]]:
    """Send requests on schedule until `args.seconds`; kill the busiest worker every
    `args.kill_every` and start its replacement."""
    assert deployment.model is not None
    live, sent, kills = list(deployment.workers), [], []
    next_kill = args.kill_every
    read_s = args.seconds + SETTLE_S
    while (now := time.monotonic() - started) < args.seconds:
        while len(sent) <= now * args.rate:
            request = Request(
                "chat", True, deployment.model.name, prompt(32, len(sent)), args.tokens,
                str(uuid.uuid4()),
            )  # fmt: skip
            sent.append(InFlight(deployment.base_url, request, read_s))
        if now >= next_kill and (victim := busiest(deployment.backend, live)):
            victim.process.signal_tree(signal.SIGKILL)
            kills.append((time.monotonic() - started, victim.name))
            victim.process.wait_gone(Deadline(10))
            live = [w for w in live if w is not victim] + [deployment.pool.add_worker("aggregate")]
            next_kill += args.kill_every
        time.sleep(0.01)  # the arrival schedule's tick, not a synchronisation
    return sent, kills


def busiest(backend: Backend, workers: list[Worker]) -> Worker | None:
    """The worker with the most requests in flight; None while any cannot be read (a new
    worker still starting): unknown, so the kill waits for the next tick."""
    try:
        inflight = backend.in_flight(workers)
    except metrics.Unanswered:
        return None
    return max(workers, key=lambda w: inflight[w.name])


def outcome(r: InFlight, tokens: int) -> str:
    response = r.response
    if not r.finished:
        return "lost"
    if response.status == 200 and response.error is None and response.completion_tokens == tokens:
        return "completed"
    error = response.error or {}
    if error.get("code") == SERVICE_UNAVAILABLE.code:
        return "failed with the migration path's error"
    return "lost"


def report(
    sent: list[InFlight], kills: list[tuple[float, str]], args: argparse.Namespace, started: float
) -> int:
    ends = Counter(outcome(r, args.tokens) for r in sent)
    print(
        f"{len(sent)} requests in {args.seconds:g} s at {args.rate:g}/s, {args.tokens} tokens "
        f"each, {os.cpu_count()} CPUs; killed: "
        + ", ".join(f"{name} at {at:.1f} s" for at, name in kills)
    )
    for name in ("completed", "failed with the migration path's error", "lost"):
        print(f"  {name}: {ends[name]}")
    windows: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    for r in sent:
        if r.response.finished_at is None:
            continue
        at, end = r.sent_at - started, r.response.finished_at - started
        during = any(at <= k < end or k <= at < k + RECOVERY_S for k, _ in kills)
        window = "during" if during else "before" if not kills or at < kills[0][0] else "after"
        windows[window].append(r.response.finished_at - r.sent_at)
    for window, latencies in windows.items():
        if latencies:
            p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
            print(f"  latency, {window} the faults: p50 {p50:.2f} s, p99 {p99:.2f} s")
    done = Counter(int(r.response.finished_at - started) for r in sent if r.response.finished_at)
    steady_bins = [done[s] for s in range(2, int(kills[0][0]))] if kills else []
    if steady_bins:
        steady = statistics.median(steady_bins)
        print(f"  steady completions: {steady:g}/s (median of the seconds before the first kill)")
        for at, name in kills:
            back = next(
                (s for s in range(int(at), int(at) + 60) if done[s] >= RECOVERED * steady), None
            )
            said = "not within 60 s" if back is None else f"{max(back - at, 0.0):.1f} s"
            print(f"  back to {RECOVERED:.0%} of it after killing {name}: {said}")
    return 1 if ends["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
