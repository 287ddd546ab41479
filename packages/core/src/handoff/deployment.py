"""The live processes of one case: services, one frontend, its workers; up, ready, and down."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import requests

from handoff import services
from handoff.backend import Backend, Model, Worker
from handoff.cases import Case
from handoff.errors import CaseFailure, HandoffError
from handoff.policies import Policy
from handoff.polling import Deadline, Timeout, poll_until
from handoff.ports import PortLeases, bindable
from handoff.processes import ManagedProcess

#: Which (component, endpoint) a worker of each role registers in the frontend's /health.
HEALTH_ENDPOINT = {
    "aggregate": ("backend", "generate"),
    "decode": ("backend", "generate"),
    "prefill": ("prefill", "generate"),
}
TEARDOWN_TIMEOUT_S = 15.0
#: Dynamo 1.6.1 lists a prefill worker in /health, and the model in /v1/models, a moment before
#: its prefill router is active; a request in between gets 503 "prefill routing ... is still
#: activating" (docs/known-issues.md). The frontend logs this line once the router is active.
PREFILL_ROUTER_ACTIVE = "Prefill router target activated"


class StartupFailure(CaseFailure):
    """A process of the deployment exited, or the deployment never became ready."""


class Deployment:
    """Ports, discovery folder and logs of its own; `stop()` leaves nothing behind."""

    def __init__(
        self,
        backend: Backend,
        case: Case,
        folder: Path,
        policy: Policy,
        roles: tuple[str, ...],
    ) -> None:
        self.backend = backend
        self.case = case
        self.folder = folder
        self.policy = policy
        self.roles = roles
        self.leases = PortLeases()
        self.processes: list[ManagedProcess] = []
        self.workers: list[Worker] = []
        self.model: Model | None = None
        self.http_port: int | None = None
        #: (monotonic time, what the frontend listed) each time that changed while starting.
        self.listings: list[tuple[float, dict[str, int]]] = []

    @property
    def base_url(self) -> str:
        return f"http://{services.LOOPBACK}:{self.http_port}"

    def start(self, deadline: Deadline) -> None:
        """Launch everything at once, then wait until the frontend can route to every worker.

        Call `stop()` afterwards whether this succeeded or not: it stops what was started.
        """
        self._launch()
        self._wait_ready(deadline)

    def _launch(self) -> None:
        self.backend.check_environment()
        for state in ("discovery", "nats"):  # stale registrations would count as instances
            shutil.rmtree(self.folder / state, ignore_errors=True)
        self.model = self.backend.prepare_model(self.folder / "model")
        if self.model.path is not None and not self.model.path.is_dir():
            raise HandoffError(
                f"the model folder {self.model.path} of {self.backend.name} does not exist: "
                "fix the backend's model_path setting (handoff config shows where it came from)"
            )
        self.http_port = self.leases.take()
        nats_port = self.leases.take() if self.case.plane == "nats" else None
        env = services.runtime_env(self.folder / "discovery", nats_port)
        if nats_port is not None:
            self._spawn("nats-server", services.nats_command(nats_port, self.folder / "nats"), env)
        self._spawn(
            "frontend",
            services.frontend_command(self.http_port, self.model, self.case.plane, self.policy),
            env,
        )
        for i, role in enumerate(self.roles):
            ports = {name: self.leases.take() for name in self.backend.ports_of(role)}
            launch = self.backend.worker(role, self.case, self.model, ports, self.folder)
            name = f"worker-{i}-{role}"
            process = self._spawn(name, launch.argv, {**env, **launch.env}, launch.niceness)
            self.workers.append(Worker(name, role, process, ports))

    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str],
        niceness: int = 0,
    ):
        process = ManagedProcess(name, argv, env, self.folder / f"{name}.log", niceness)
        self.processes.append(process)
        process.start()
        return process

    def expected_instances(self) -> Counter[tuple[str, str]]:
        return Counter(HEALTH_ENDPOINT[role] for role in self.roles)

    def _wait_ready(self, deadline: Deadline) -> None:
        expected = self.expected_instances()
        assert self.model is not None

        def probe() -> tuple[bool | None, str]:
            self.raise_if_exited()
            try:
                health = requests.get(self.base_url + "/health", timeout=2).json()
                models = requests.get(self.base_url + "/v1/models", timeout=2).json()
            except (requests.RequestException, ValueError) as exc:
                return None, f"frontend not answering ({type(exc).__name__})"
            listed = Counter(
                (i.get("component"), i.get("endpoint"))
                for i in health.get("instances", [])
                if (i.get("component"), i.get("endpoint")) in expected
            )
            names = [m.get("id") for m in models.get("data", [])]
            shown = {"/".join(key): n for key, n in sorted(listed.items())}
            shown["models"] = len(names)
            if not self.listings or self.listings[-1][1] != shown:
                self.listings.append((time.monotonic(), shown))
            seen = f"/health instances {dict(listed)}, /v1/models {names}"
            if listed != expected or self.model.name not in names:
                return None, seen
            if "prefill" in self.roles and not self._frontend_logged(PREFILL_ROUTER_ACTIVE):
                return None, seen + f", no {PREFILL_ROUTER_ACTIVE!r} in the frontend's log yet"
            return True, ""

        router = ", its prefill router active" if "prefill" in self.roles else ""
        poll_until(
            probe,
            deadline,
            f"the frontend to list instances {dict(expected)} and model {self.model.name!r}"
            + router,
        )

    def _frontend_logged(self, line: str) -> bool:
        frontend = next(p for p in self.processes if p.name == "frontend")
        try:
            return line in frontend.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return False

    def raise_if_exited(self) -> None:
        """Fail with the name, exit code and log tail of the first process that has exited."""
        for process in self.processes:
            code = process.exit_code()
            if code is not None:
                raise StartupFailure(
                    f"{process.name} exited with code {code} during start-up; "
                    f"log {process.log_path}:\n{process.log_tail()}"
                )

    def stop(self) -> list[str]:
        """Kill every process started, check they are gone and the ports are free.

        Returns the problems found (survivors, ports still bound); empty means clean.
        """
        problems = []
        deadline = Deadline(TEARDOWN_TIMEOUT_S)
        started = [p for p in reversed(self.processes) if p.popen is not None]
        for process in started:  # signal every tree first, then wait: they die in parallel
            process.kill()
        for process in started:
            if survivors := process.wait_gone(deadline):
                pids = ", ".join(str(p.pid) for p in survivors)
                problems.append(f"{process.name} still alive after SIGKILL: pids {pids}")
        try:
            poll_until(
                lambda: (True, None) if not (busy := self._busy_ports()) else (None, busy),
                deadline,
                "the deployment's ports to be free",
            )
        except Timeout as exc:
            problems.append(str(exc))
        self.leases.release()
        return problems

    def _busy_ports(self) -> list[int]:
        return [port for port in self.leases.ports if not bindable(port)]
