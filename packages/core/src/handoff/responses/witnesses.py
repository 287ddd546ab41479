"""The mechanisms of the known defects, read from the system (`policies.Witness`): a case is its
known defect only where what the defect says happens inside the system was seen there, not
only what the user got. Each reader says whether it was there and what was read; None where the
reading itself failed (not proven, never absent)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import requests

from handoff import releases
from handoff.backend import Backend, Worker
from handoff.deployment import Deployment
from handoff.history import History
from handoff.machine import etcd, worker_logs
from handoff.metrics import Unanswered
from handoff.policies import (
    DRAIN_CUT,
    FRONTEND_GAVE_UP,
    LOST_RAN_ON,
    REJECTED_WORKERS,
    UNLISTED,
    KnownDefect,
    Witness,
)
from handoff.verdict import Verdict, against_known_defect

#: What a worker's runtime logs when its drain timeout passes with a request still in flight
#: (Dynamo 1.6.1: the runtime's endpoints, or the request plane's ingress).
DRAIN_TIMED_OUT = re.compile(
    r"Graceful endpoint shutdown timed out|Timed out waiting for inflight requests to drain"
)

Reading = tuple[bool | None, str]


def matched(*reads: tuple[Path, re.Pattern[str]]) -> list[list[str]] | str:
    """The lines of each log that match its pattern; why, where a log could not be read."""
    try:
        return [worker_logs.matching(path, pattern) for path, pattern in reads]
    except OSError as exc:
        return f"a log could not be read: {exc}"


def drain_cut(deployment: Deployment, worker: Worker, history: History) -> Reading:
    """The drained worker's runtime gave up its drain with the request in flight, and the
    frontend, losing the stream, classed its end as an unclassified failure: no cause it
    migrates on."""
    assert deployment.frontend is not None
    unmigrated = re.compile(releases.current().unmigrated_end)
    found = matched(
        (worker.process.log_path, DRAIN_TIMED_OUT), (deployment.frontend.log_path, unmigrated)
    )
    if isinstance(found, str):
        return None, found
    gave_up, unclassified = found
    said = (
        f"{worker.name}'s log {'shows' if gave_up else 'has no line of'} its drain timing out"
        f"; the frontend's log shows {len(unclassified)} stream(s) ended without a cause it "
        f"migrates on"
    )
    return bool(gave_up and unclassified), said


def unlisted(deployment: Deployment, worker: Worker, history: History) -> Reading:
    """The worker's registrations, read again from the discovery store now, and those it was
    drawn with: the frontend lists none of them. A worker that registered again and is listed
    is not lost, whatever its probes said."""
    drawn = deployment.pool.instance_ids.get(worker.name, set())
    try:
        now = deployment.pool.discovery.instance_ids(worker.ports["system"])
        listed, _ = deployment.listing()
    except (etcd.Unanswered, requests.RequestException, ValueError, OSError) as exc:
        return None, f"the store or the frontend did not answer: {exc}"
    ids = now | drawn
    shown = sorted(ids & set().union(*listed.values()))
    said = (
        f"{worker.name}'s registrations in the store now: {sorted(now) or 'none'}, drawn with "
        f"{sorted(drawn)}; the frontend lists {shown or 'none of them'}"
    )
    return (bool(ids) and not shown), said


def engine_reading(backend: Backend, worker: Worker) -> Callable[[], float | None]:
    """Reads the requests `worker`'s engine runs (its in-flight gauge where the backend names
    no engine gauge); None where it does not answer: unknown, never 0."""

    def running() -> float | None:
        try:
            counts = backend.engine_running([worker]) or backend.in_flight([worker])
        except Unanswered:
            return None
        return counts[worker.name]

    return running


def lost_ran_on(deployment: Deployment, worker: Worker, history: History) -> Reading:
    """After the move, the worker's engine reported a request running (`recovery.Heal`), and
    the user's stream got no content after it; of the last trial alone (a race case repeats
    its lifecycle on one deployment, `responses.exercise.exercise`)."""
    events = history.timeline()
    trials = [at for at, e in enumerate(events) if e.name == "trial"]
    events = events[trials[-1] :] if trials else events
    running = [e for e in events if e.name == "lost_request_running"]
    resumed = [e for e in events if e.name == "worker_resumed"]
    moved_at = next((e.at for e in events if e.name == "migration_seen"), None)
    if moved_at is None:
        return False, "the frontend counted no move"
    after = [e for e in events if e.name == "chunk" and e.at > moved_at and e.data.get("text")]
    said = (
        f"{worker.name}'s engine reported {running[0].data['running']:g} request(s) running "
        f"{running[0].at - moved_at:.2f} s after the move"
        if running
        else f"{worker.name}'s engine reported no request running after the move"
    )
    said += f"; the user's stream got {len(after)} content frame(s) after the move"
    said += "" if resumed else f"; {worker.name} was not run again before the verdict"
    return bool(running) and not after, said


#: What Dynamo 1.6.1's runtime logs when it stops renewing its lease and shuts down.
GAVE_UP = re.compile(r"Unable to maintain lease")


def frontend_gave_up(deployment: Deployment, worker: Worker, history: History) -> Reading:
    """After etcd came back, the frontend's log says it gave up its lease, and a lease of its
    own (`discovery_plane.FrontendLease`) was read alive once the frontend had ended: it did
    not lose the lease, it let go of it (measured 2026-12-07: renewed up to the end, 5 s left
    when the frontend had ended)."""
    assert deployment.frontend is not None
    reads = [e.data for e in history.timeline() if e.name == "frontend_lease_read"]
    try:
        gave_up = worker_logs.matching(deployment.frontend.log_path, GAVE_UP)
    except OSError as exc:
        return None, f"the frontend's log could not be read: {exc}"
    after = [r for r in reads if not r["frontend_running"]]
    if not any("left" in r for r in after):
        return None, f"etcd's leases were not read once the frontend had ended ({len(reads)} read)"
    alive = sorted({lease for r in after for lease, t in r.get("left", {}).items() if t})
    said = (
        f"the frontend's log {'says' if gave_up else 'never says'} `Unable to maintain lease`; "
        f"once it had ended, etcd held {', '.join(alive) or 'no lease of its'} alive"
    )
    return bool(gave_up and alive), said


def rejected_workers(deployment: Deployment, worker: Worker | None, history: History) -> Reading:
    """The frontend rejected workers of the model as an incompatible configuration (a worker
    set of two releases whose model cards differ, of which it keeps one), and each move it
    counted failed found no worker: a move that failed for another reason is not this."""
    assert deployment.frontend is not None
    failed = [e.data["counts"]["failed"] for e in history.events if e.name == "metrics_read"]
    if not failed:
        return None, "the frontend's counters were never read"
    log = deployment.frontend.log_path
    found = matched((log, REJECTED), (log, NO_WORKER))
    if isinstance(found, str):
        return None, found
    rejected, nowhere = found
    said = (
        f"the frontend's log shows {len(rejected)} rejection(s) of workers, and "
        f"{len(nowhere)} move(s) that found no worker, of {failed[-1]} counted failed"
    )
    return bool(rejected) and len(nowhere) >= failed[-1], said


#: What Dynamo's frontend logs when it refuses workers whose model card differs from the one it
#: accepted first for the model.
REJECTED = re.compile(r"Rejected incompatible workers")
#: What it logs when a move finds no worker to go to.
NO_WORKER = re.compile(r"Cannot recreate stream error=Unavailable: No workers available")
#: The readings that need no struck worker: a rolling restart strikes every worker.
WORKERLESS = {REJECTED_WORKERS.key}

READERS: dict[str, Callable[[Deployment, Worker, History], Reading]] = {
    REJECTED_WORKERS.key: rejected_workers,
    DRAIN_CUT.key: drain_cut,
    UNLISTED.key: unlisted,
    LOST_RAN_ON.key: lost_ran_on,
    FRONTEND_GAVE_UP.key: frontend_gave_up,
}


def read(
    witness: Witness, deployment: Deployment, worker: Worker, history: History
) -> dict[str, Reading]:
    """The reading of `witness` about the faulted `worker`, by its key (`Verdict.witnessed`);
    nothing where its reading is made elsewhere, in the exercise that sees it happen."""
    reader = READERS.get(witness.key)
    if reader is None:
        return {}
    found = reader(deployment, worker, history)
    history.record("witness_read", key=witness.key, seen=found[0], said=found[1])
    return {witness.key: found}


def witness(
    verdict: Verdict,
    defect: KnownDefect | None,
    deployment: Deployment,
    worker: Worker,
    history: History,
) -> None:
    """Read the defect's witness about the faulted `worker` into `verdict`, where the case
    failed (a pass needs none: it says the fix has arrived)."""
    if defect is not None and verdict.reasons:
        verdict.witnessed.update(read(defect.witness, deployment, worker, history))


def judged_against(
    verdict: Verdict,
    defect: KnownDefect | None,
    deployment: Deployment,
    worker: Worker,
    history: History,
    faulted: str | None = None,
) -> Verdict:
    """`against_known_defect`, its witness read first (`witness`)."""
    witness(verdict, defect, deployment, worker, history)
    return against_known_defect(verdict, defect, faulted)
