"""A worker that joins while a load case's streams are in flight (the `join` topology), as an
orchestrator replaces a worker it lost: started as the fault lands, in the deployment's own
discovery store, so that the case's frontend lists it once it registers.

The join must happen mid-stream, or the case has not shown what it exists for: the frontend
lists the joiner while a request is still open, else not proven. Once every response has
ended the joiner must take a request and serve it as a case's own
(`recovery.rejoin_problems`). The requests the frontend moved to it are judged with the rest
of the case. Dynamo lists a worker once its endpoint serves, so a request routed to a joiner not
ready shows as one that hangs, or departs from its text, there: the load case's own checks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import requests

from handoff.backend import Shape, Worker
from handoff.client import InFlight, Request
from handoff.deployment import Deployment, silent
from handoff.history import History
from handoff.machine import registrations
from handoff.polling import POLL_INTERVAL_S
from handoff.pool import stop_trees
from handoff.responses import recovery


class Joiner:
    """The replacement, and when the case's frontend first listed it (polled from its start:
    the listing is the frontend's, read over HTTP, so `listed_at` is at most one poll late)."""

    def __init__(self, deployment: Deployment, role: str, history: History) -> None:
        self.deployment = deployment
        self.worker: Worker = deployment.pool.add_worker(role)
        deployment.joined.append(self.worker)
        self.started_at = time.monotonic()
        self.listed_at: float | None = None
        self.seen = "not registered yet"
        self.retired = False
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._until_listed, name="join-watch", daemon=True)
        self._watch.start()
        history.record("worker_joining", worker=self.worker.name, pid=self.worker.process.pid)

    def _until_listed(self) -> None:
        while self.listed_at is None and not self._stop.wait(POLL_INTERVAL_S):
            self.listed_at = self._listed_now()

    def _listed_now(self) -> float | None:
        store = self.deployment.pool.store
        ids = registrations.instance_ids(store, self.worker.ports["system"])
        if not ids:
            self.seen = "not registered yet"
            return None
        try:
            listed, _ = self.deployment.listing()
        except (requests.RequestException, ValueError) as exc:
            self.seen = f"frontend not answering ({silent(exc)})"
            return None
        if ids <= set().union(*listed.values()):
            return time.monotonic()
        self.seen = f"registered as {sorted(ids)}, not listed"
        return None

    def unproven(self, held: list[InFlight], faulted_at: float, history: History) -> list[str]:
        """Not proven where the frontend did not list the joiner while a request was open."""
        self._stop.set()
        self._watch.join()
        ends = [i.response.finished_at for i in held if i.response.finished_at is not None]
        last_end = max(ends, default=None)
        history.record(
            "worker_joined",
            worker=self.worker.name,
            listed_after_fault_s=None
            if self.listed_at is None
            else round(self.listed_at - faulted_at, 3),
            last_response_after_fault_s=None
            if last_end is None
            else round(last_end - faulted_at, 3),
        )
        if self.listed_at is not None and last_end is not None and self.listed_at < last_end:
            return []
        when = (
            f"{self.listed_at - faulted_at:.1f} s after the fault"
            if self.listed_at is not None
            else f"never ({self.seen})"
        )
        return [
            f"the joining worker {self.worker.name} was listed {when}, and no request was "
            f"open then: it did not join mid-stream (raise the output length)"
        ]

    def serving_problems(self, request: Request, shape: Shape, history: History) -> list[str]:
        """The joiner takes a request of its own once the load is over, and serves it right."""
        return recovery.rejoin_problems(
            self.deployment, self.worker, request, history, shape, recovery.JOINED
        )

    def retire(self) -> list[str]:
        """Stop the joiner and remove its registrations, so that a shared pool's next case
        never lists it; the problems its stop found. Once."""
        if self.retired:
            return []
        self.retired = True
        self._stop.set()
        self._watch.join()
        self.deployment.joined.remove(self.worker)
        pool = self.deployment.pool
        ids = registrations.instance_ids(pool.store, self.worker.ports["system"])
        problems = stop_trees([self.worker.process], list(self.worker.ports.values()))
        registrations.remove(pool.store, ids)
        return problems


@contextmanager
def joined(
    deployment: Deployment, role: str, history: History, joins: bool
) -> Iterator[Joiner | None]:
    """A `Joiner` of `role` where the case `joins`, retired on the way out however the case
    ends; else None."""
    joiner = Joiner(deployment, role, history) if joins else None
    try:
        yield joiner
    finally:
        if joiner:
            joiner.retire()
