"""A worker that joins while a case's requests are in flight (the `join` and `rolling`
topologies), as an orchestrator replaces a worker it lost: started as the fault lands, in the
deployment's own discovery store, so that the case's frontend lists it once it registers.

The join must happen while the case's requests are open, or the case has not shown what it
exists for: the joiner must take a request of the case (a moved one, or a new one of a steady
load: judged with the rest of the case), or, where the case gives a probe request, a probe
sent once the frontend lists the joiner and no longer lists the workers the case took away
(so that no probe can meet a faulted worker and be moved), before the case's last request
ends. Else not proven. The probe it took is judged as a case's own request and must be
served by it alone (`recovery.served_problems`). Where it took none in time, it must still
take one once the load is over (`recovery.rejoin_problems`). A joiner that exits fails the
case with its exit code."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace

import requests

from handoff.backend import Shape, Worker
from handoff.client import InFlight, Request
from handoff.deployment import Deployment, silent
from handoff.history import History
from handoff.machine import etcd
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.pool import stop_trees
from handoff.responses import recovery, waits
from handoff.verdict import completion_problems

#: How often the watch reads the frontend's listing until it lists the joiner (each reading is
#: two HTTP requests and a look at the discovery store, beside the case's own work), and then
#: sends a probe, with at most PROBES_OPEN of them unanswered: a probe routed to a busy worker
#: waits in its queue.
WATCH_S = 0.25
PROBES_OPEN = 4


class Joiner:
    """The replacement; when the case's frontend first listed it (read over HTTP, so late by a
    reading at most), and the probe it took while the case's requests were open, if it did."""

    def __init__(
        self,
        deployment: Deployment,
        role: str,
        history: History,
        probe: Request | None,
        load_open: Callable[[], bool],
        gone: Collection[str],
        deadline: Deadline,
    ) -> None:
        self.deployment = deployment
        #: The case's: a probe routed to a busy worker waits in its queue, as the case's own
        #: requests do (on vLLM's CPU engine, behind whole responses).
        self.deadline = deadline
        #: The workers the case takes away: no probe goes out while the frontend lists one.
        self.gone = set(gone)
        self.worker: Worker = deployment.pool.add_worker(role)
        deployment.joined.append(self.worker)
        self.probe_of, self.load_open = probe, load_open
        self.listed_at: float | None = None
        #: The probe the joiner's log named while the load was open, and when it was seen.
        self.taken: tuple[InFlight, float] | None = None
        self.probes: list[InFlight] = []
        self.seen = "not registered yet"
        self.retired = False
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._until_served, name="join-watch", daemon=True)
        self._watch.start()
        history.record("worker_joining", worker=self.worker.name, pid=self.worker.process.pid)

    def _until_served(self) -> None:
        """Until it is listed, then until it takes a probe while the load is open. A reading
        that fails is said in `seen`, never taken for an answer."""
        try:
            while self.listed_at is None and not self._stop.wait(WATCH_S):
                self.listed_at = self._listed_now()
            while self.taken is None and self.load_open() and not self._stop.wait(WATCH_S):
                if self.probe_of is not None and self._gone_unlisted():
                    self._probe_once()
        except Exception as exc:
            self.seen = f"the watch stopped: {exc!r}"

    def _listed_now(self) -> float | None:
        if (code := self.worker.process.exit_code()) is not None:
            self.seen = f"exited with code {code}"
            self._stop.set()
            return None
        try:
            ids = self.deployment.pool.discovery.instance_ids(self.worker.ports["system"])
        except etcd.Unanswered as exc:  # unknown: asked again
            self.seen = str(exc)
            return None
        if not ids:
            self.seen = "not registered yet"
            return None
        try:
            listed, _ = self.deployment.listing()
        except (requests.RequestException, ValueError) as exc:
            self.seen = f"frontend not answering ({silent(exc)})"
            return None
        if ids <= set().union(*listed.values()):
            self.seen = "listed"
            return time.monotonic()
        self.seen = f"registered as {sorted(ids)}, not listed"
        return None

    def _gone_unlisted(self) -> bool:
        try:
            listed, _ = self.deployment.listing()
        except (requests.RequestException, ValueError) as exc:
            self.seen = f"frontend not answering ({silent(exc)})"
            return False
        still = self.gone - set(self.deployment.unlisted_in(listed))
        self.seen = f"the frontend still lists {sorted(still)}" if still else "listed"
        return not still

    def _probe_once(self) -> None:
        """Send a probe unless PROBES_OPEN are unanswered; note the first the joiner took."""
        if sum(not p.finished for p in self.probes) < PROBES_OPEN:
            probe = replace(recovery.short(self.probe_of), request_id=str(uuid.uuid4()))
            url = self.deployment.base_url
            read_s = self.deadline.remaining() + waits.CLIENT_GRACE_S
            self.probes.append(InFlight(url, probe, read_s))
        took = recovery.received_ids(self.worker)
        self.taken = next(
            ((p, time.monotonic()) for p in self.probes if p.request.request_id in took), None
        )

    def problems(
        self,
        held: list[InFlight],
        shape: Shape,
        served: dict[str, list[str]],
        history: History,
    ) -> tuple[list[str], list[str]]:
        """What failed, and what was not proven: a joiner that exited; a probe that did not
        complete; unless its log names a request of the case (`served`), the probe it took
        while the case's requests were open, judged (else not proven, and it must take one
        now)."""
        self._stop.set()
        self._watch.join()
        problems = self.probes_ended()
        last_end = max((i.response.finished_at or 0.0 for i in held), default=0.0)
        history.record(
            "worker_joined", worker=self.worker.name, probes=len(self.probes), seen=self.seen,
            listed_before_last_end_s=None if self.listed_at is None
            else round(last_end - self.listed_at, 3),
            took_before_last_end_s=round(last_end - self.taken[1], 3) if self.taken else None,
        )  # fmt: skip
        if (code := self.worker.process.exit_code()) is not None:
            return [*problems, self.exited(code)], []
        if any(self.worker.name in workers for workers in served.values()):
            return problems, []
        if self.taken is not None and self.taken[1] < last_end:
            probe = self.taken[0]
            owed = recovery.probe_reference(self.deployment, probe.request, shape, history)
            return problems + recovery.served_problems(
                self.deployment, self.worker, probe.request, probe.response, 0, owed,
                recovery.JOINED,
            ), []  # fmt: skip
        late = (
            f"{self.worker.name}, {recovery.JOINED}, took no request while one of the case's "
            f"was open ({len(self.probes)} probe(s); {self.seen}): it did not join mid-stream "
            f"(raise the output length)"
        )
        return problems + recovery.rejoin_problems(
            self.deployment, self.worker, self.probe_of or held[0].request, history, shape,
            recovery.JOINED, self.gone,
        ), [late]  # fmt: skip

    def probes_ended(self) -> list[str]:
        """Every probe ends within the case's deadline, complete; the problems of any other."""

        def probe() -> tuple[bool | None, str]:
            still = sum(not p.finished for p in self.probes)
            return (None if still else True), f"{still} probe(s) open"

        try:
            poll_until(probe, self.deadline, "every probe of the joiner")
        except Timeout as exc:
            return [f"a probe sent while {self.worker.name} joined hung: {exc}"]
        return [
            f"a probe sent while {self.worker.name} joined failed: {problem}"
            for p in self.probes
            for problem in completion_problems(p.response, recovery.REJOIN_TOKENS)
        ]

    def exited(self, code: int) -> str:
        return (
            f"{self.worker.name}, {recovery.JOINED}, exited with code {code}; log "
            f"{self.worker.process.log_path}:\n{self.worker.process.log_tail()}"
        )

    def retire(self) -> list[str]:
        """Stop the joiner, then remove its registrations, so that a shared pool's next case
        never lists it; the problems its stop found. Once."""
        if self.retired:
            return []
        self.retired = True
        self._stop.set()
        self._watch.join()
        self.deployment.joined.remove(self.worker)
        pool = self.deployment.pool
        problems = stop_trees([self.worker.process], list(self.worker.ports.values()))
        pool.discovery.remove(pool.discovery.instance_ids(self.worker.ports["system"]))
        return problems


@contextmanager
def retired(joiner: Joiner, history: History) -> Iterator[Joiner]:
    """`joiner`, retired on the way out however the case ends: what that stop finds on a case
    that failed first goes in the history."""
    try:
        yield joiner
    finally:
        if left := joiner.retire():
            history.record("joiner_retired", worker=joiner.worker.name, problems=left)
