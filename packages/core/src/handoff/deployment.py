"""The system under test for one case: its own frontend, with the case's migration policy, on
workers drawn from a pool (handoff.pool); up, ready, and down."""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import requests

from handoff import client
from handoff.backend import Backend, Model, Worker
from handoff.cases import Case
from handoff.client import Request, Response
from handoff.errors import CaseFailure
from handoff.machine import firewall, services, worker_logs
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.machine.ports import PortLeases
from handoff.machine.processes import ManagedProcess
from handoff.policies import Policy
from handoff.pool import Pool, PoolKey, StartupFailure, stop_all

#: Which (component, endpoint) a worker of each role registers in the frontend's /health.
HEALTH_ENDPOINT = {
    "aggregate": ("backend", "generate"),
    "decode": ("backend", "generate"),
    "prefill": ("prefill", "generate"),
}
#: Dynamo 1.6.1 lists a prefill worker in /health, and the model in /v1/models, a moment before
#: its prefill router is active; a request in between gets 503 "prefill routing ... is still
#: activating" (docs/known-issues.md). The frontend logs this line once the router is active.
PREFILL_ROUTER_ACTIVE = "Prefill router target activated"
#: Dynamo 1.6.1 lists the model in /v1/models a moment before its endpoints serve it: a request
#: in between gets 404 with an empty message (seen 6 ms after the listing, under load; docs/
#: known-issues.md). The frontend logs this line, naming the model, as it enables them.
MODEL_COMMITTED = "Committed discovered model group"
#: The output of the request that warms a worker (`Deployment._warm`).
WARM_TOKENS = 8

__all__ = ["Deployment", "StartupFailure"]


def silent(exc: Exception) -> str:
    """A listing that could not be read: unknown, never an empty one."""
    return f"the frontend does not answer /health ({type(exc).__name__})"


class Deployment:
    """A frontend of its own on `pool`'s workers; without a pool, one of its own in `folder`
    (a fresh deployment), stopped with the frontend. `stop()` leaves nothing behind."""

    def __init__(
        self,
        backend: Backend,
        case: Case,
        folder: Path,
        policy: Policy,
        roles: tuple[str, ...],
        pool: Pool | None = None,
        frontend_env: Mapping[str, str] | None = None,
    ) -> None:
        self.backend = backend
        self.case = case
        self.folder = folder
        self.policy = policy
        self.roles = roles
        #: What the case sets in its frontend's environment beyond the pool's (a stream timeout).
        self.frontend_env = dict(frontend_env or {})
        #: Whether the pool is this case's own, stopped with it.
        self.fresh = pool is None
        layout = PoolKey.of(backend, case, roles).discovery
        self.pool = pool or Pool(backend, case, roles, folder, discovery=layout)
        self.leases = PortLeases()
        self.frontend: ManagedProcess | None = None
        #: The frontend that served the drawn workers their first request, stopped since.
        self.warm_up: ManagedProcess | None = None
        self.workers: list[Worker] = []
        #: Workers that joined the running case (`responses.joining`), while they run.
        self.joined: list[Worker] = []
        self.http_port: int | None = None
        #: (monotonic time, what the frontend listed) each time that changed while starting.
        self.listings: list[tuple[float, dict[str, int]]] = []
        #: The discovery entries of faulted workers removed when a shared pool took them back.
        self.removed: list[str] = []

    @property
    def model(self):
        return self.pool.model

    @property
    def model_name(self) -> str:
        """The served model's name, once the pool has made its model."""
        assert self.model is not None
        return self.model.name

    @property
    def serving(self) -> list[Worker]:
        """Every worker the case's frontend may route to: the drawn ones and those that joined."""
        return self.workers + self.joined

    @property
    def base_url(self) -> str:
        return f"http://{services.LOOPBACK}:{self.http_port}"

    @property
    def processes(self) -> list[ManagedProcess]:
        """The processes serving this case: the pool's NATS, the frontend, the drawn workers."""
        return ([self.pool.nats] if self.pool.nats else []) + self.dynamo_processes

    @property
    def dynamo_processes(self) -> list[ManagedProcess]:
        """Dynamo's processes of this case: its frontend and the drawn workers."""
        return ([self.frontend] if self.frontend else []) + [w.process for w in self.workers]

    @property
    def ports(self) -> list[int]:
        """The ports serving this case: the frontend's and a fresh pool's, or in a shared pool
        NATS's and the drawn workers'."""
        if self.fresh:
            return self.leases.ports + self.pool.leases.ports
        nats = [self.pool.nats_port] if self.pool.nats_port else []
        drawn = [port for w in self.workers for port in w.ports.values()]
        return self.leases.ports + nats + drawn

    def start(self, deadline: Deadline) -> None:
        """Draw the workers (launching them first when fresh), start the frontend, and wait
        until it lists exactly the drawn workers. Call `stop()` afterwards whether this
        succeeded or not: it stops what was started."""
        if left := firewall.own_tables():
            raise CaseFailure(
                f"nftables table(s) {', '.join(left)} of an earlier case still in place: a "
                f"partition was never healed, and its rules would cut this case's workers"
            )
        if not self.pool.started:
            self.pool.start()
        self.workers = self.pool.draw(self.case, deadline)
        cold = [w for w in self.workers if w.name not in self.pool.warmed]
        if cold and self.frontend_env and self.backend.slow_first_request:
            self._warm(cold, deadline)
        self._start_frontend("frontend", self.frontend_env, self.leases, deadline)

    def _start_frontend(
        self, name: str, env: Mapping[str, str], leases: PortLeases, deadline: Deadline
    ) -> None:
        assert self.model is not None
        self.http_port = leases.take()
        command = frontend_command(self.http_port, self.model, self.case.plane, self.policy)
        beside = self.pool.runs_beside("frontend", "", 0, False)
        if self.pool.mix and beside:
            command = self.pool.mix.argv(command, True)
        self.frontend = ManagedProcess(
            name,
            command,
            {**self.pool.env, **self.pool.frontend_env(), **self.pool.beside_env(beside), **env},
            self.folder / f"{name}.log",
            preloader=self.pool.preloader,
        )
        self.frontend.start()
        self._wait_ready(deadline)

    def _warm(self, cold: list[Worker], deadline: Deadline) -> None:
        """Serve each drawn worker its first request through a frontend with none of the case's
        settings, then stop it: a worker's first request pays for its start (seconds on a CPU,
        a KV transfer's handshake), which a case's stream timeout would read as a silent worker
        and move (`Backend.slow_first_request`). The router's round robin gives each worker of
        a role one of as many requests as the role has workers."""
        leases = PortLeases()
        try:
            self._start_frontend("warm-up-frontend", {}, leases, deadline)
            shape = self.backend.shape(self.case, 0)
            request = Request(self.case.api, False, self.model_name, shape.prompt, WARM_TOKENS)
            for _ in range(max(Counter(w.role for w in self.workers).values())):
                response = Response()
                client.send(self.base_url, request, response, deadline.remaining())
                if response.status != 200 or response.error or response.exception:
                    raise StartupFailure(
                        f"a request to warm {', '.join(w.name for w in cold)} failed: "
                        f"{response.summary()}"
                    )
        finally:
            self.warm_up, self.frontend = self.frontend, None
            problems = stop_all([self.warm_up] if self.warm_up else [], leases)
        if problems:
            raise StartupFailure(f"the warm-up frontend did not stop: {'; '.join(problems)}")
        self.pool.warmed.update(w.name for w in self.workers)

    def expected_instances(self) -> dict[tuple[str, str], set[int]]:
        """The instance ids the frontend must list, by (component, endpoint): the drawn
        workers' own, no more."""
        expected: dict[tuple[str, str], set[int]] = {}
        for worker in self.workers:
            ids = self.pool.instance_ids.get(worker.name, set())
            expected.setdefault(HEALTH_ENDPOINT[worker.role], set()).update(ids)
        return expected

    def listing(self) -> tuple[dict[tuple[str, str], set[int]], list[str]]:
        """What the frontend lists now: instance ids by (component, endpoint) of every role
        (`HEALTH_ENDPOINT`), and its models. Raises requests.RequestException or ValueError where it
        does not answer."""
        health = requests.get(self.base_url + "/health", timeout=2).json()
        models = requests.get(self.base_url + "/v1/models", timeout=2).json()
        expected = HEALTH_ENDPOINT.values()
        listed: dict[tuple[str, str], set[int]] = {}
        for instance in health.get("instances", []):
            where = (instance.get("component"), instance.get("endpoint"))
            if where in expected:
                listed.setdefault(where, set()).add(instance.get("instance_id"))
        return listed, [m.get("id") for m in models.get("data", [])]

    def view(self) -> str:
        """The frontend's listing now, in words: what a failed wait on new requests is judged
        beside (a worker it no longer lists, a model it lost)."""
        try:
            return self.describe(self.listing())
        except (requests.RequestException, ValueError) as exc:
            return silent(exc)

    def describe(self, listing: tuple[dict[tuple[str, str], set[int]], list[str]]) -> str:
        """One reading of `listing()` in words, naming the case's workers it lists none of."""
        listed, names = listing
        counts = {"/".join(k): len(ids) for k, ids in sorted(listed.items())}
        gone = self.unlisted_in(listed)
        dropped = f"; it lists none of {', '.join(gone)}" if gone else ""
        return f"the frontend lists instances {counts} and models {names}{dropped}"

    def unlisted_in(self, listed: dict[tuple[str, str], set[int]]) -> list[str]:
        """The case's workers with known instance ids of which `listed` holds none."""
        seen = set().union(*listed.values())
        known = [(w.name, self.pool.instance_ids.get(w.name)) for w in self.workers]
        return [name for name, ids in known if ids and not ids & seen]

    def _wait_ready(self, deadline: Deadline) -> None:
        expected = self.expected_instances()
        ours = set().union(*expected.values())
        assert self.model is not None

        def probe() -> tuple[bool | None, str]:
            self.raise_if_exited()
            try:
                listed, names = self.listing()
            except (requests.RequestException, ValueError) as exc:
                return None, f"frontend not answering ({type(exc).__name__})"
            listed = {where: ids for where, ids in listed.items() if where in expected}
            if strangers := set().union(*listed.values()) - ours:
                raise CaseFailure(
                    f"the frontend lists instance(s) {sorted(strangers)} that are none of this "
                    f"case's workers ({sorted(ours)}): a stale registration in "
                    f"{self.pool.discovery}"
                )
            counts = {where: len(ids) for where, ids in listed.items()}
            shown = {"/".join(k): n for k, n in sorted(counts.items())}
            shown["models"] = len(names)
            if not self.listings or self.listings[-1][1] != shown:
                self.listings.append((time.monotonic(), shown))
            seen = f"/health instances {counts}, /v1/models {names}"
            awaited = [MODEL_COMMITTED] + (
                [PREFILL_ROUTER_ACTIVE] if "prefill" in self.roles else []
            )
            if missing := [line for line in awaited if not self._logged(line)]:
                seen += (
                    f", no {' or '.join(map(repr, missing))} for {self.model.name!r} in its log yet"
                )
                return None, seen
            if listed != expected or self.model.name not in names:
                return None, seen
            return True, ""

        wanted = {where: len(ids) for where, ids in expected.items()}
        router = ", its prefill router active" if "prefill" in self.roles else ""
        awaited = f"the frontend to list instances {wanted} and model {self.model.name!r}"
        awaited += f", its endpoints enabled{router}"
        try:
            poll_until(probe, deadline, awaited)
        except Timeout as exc:
            assert self.frontend is not None
            raise StartupFailure(
                f"{exc}; log {self.frontend.log_path}:\n{self.frontend.log_tail()}"
            ) from exc

    def _logged(self, marker: str) -> bool:
        """Whether the frontend logged `marker` on a line naming the case's model (the log's
        colours stripped): its endpoints enabled, its prefill router active."""
        assert self.frontend is not None and self.model is not None
        try:
            found = worker_logs.matching(self.frontend.log_path, re.compile(re.escape(marker)))
        except FileNotFoundError:
            return False
        wanted = f"model_name={self.model.name}"
        return any(wanted in line.replace('"', "") for line in found)

    def raise_if_exited(self) -> None:
        """Fail with the name, exit code and log tail of the first process that has exited."""
        self.pool.raise_if_exited()
        if self.frontend is not None and (code := self.frontend.exit_code()) is not None:
            raise StartupFailure(
                f"frontend exited with code {code} during start-up; "
                f"log {self.frontend.log_path}:\n{self.frontend.log_tail()}"
            )

    def replace(self, worker: Worker) -> str | None:
        """The name of the successor a shared pool starts for `worker` now that it is gone
        (`Pool.replace_beside_case`); None for a fresh deployment, stopped with its case."""
        successor = None if self.fresh else self.pool.replace_beside_case(worker)
        return successor.name if successor else None

    def stop(self) -> list[str]:
        """Stop the frontend, and the pool when it is this case's own; give the drawn workers
        back to a shared pool. Returns the problems found (survivors, ports still bound: a
        shared pool's for the workers gone, as a fresh pool's for all). A partition still in
        place is healed first, so that the workers go back whole."""
        problems = heal_partitions()
        problems += stop_all([self.frontend] if self.frontend else [], self.leases)
        if self.fresh:
            problems += self.pool.stop()
        else:
            self.removed, given_back = self.pool.give_back(self.workers)
            problems += given_back
        return problems


def heal_partitions() -> list[str]:
    """Remove the nftables tables this process still has in place (a case that failed before
    its heal); a table that stays is a problem."""
    if not (found := firewall.own_tables()):
        return []  # the usual case: one listing, no second
    for table in found:
        firewall.delete(table)
    left = firewall.own_tables()
    return [f"nftables table {table} still in place after teardown" for table in left]


def frontend_command(http_port: int, model: Model, plane: str, policy: Policy) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dynamo.frontend",
        "--http-host",
        services.LOOPBACK,
        "--http-port",
        str(http_port),
        "--request-plane",
        plane,
        *(["--model-path", str(model.path)] if model.path is not None else []),
        "--model-name",
        model.name,
        "--router-mode",
        "round-robin",
        *policy.frontend_flags(),
    ]
