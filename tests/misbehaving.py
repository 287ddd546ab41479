"""Ways to make a backend misbehave that the tests of every engine share."""

import contextlib
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import psutil

from handoff import metrics
from handoff.machine.polling import Deadline, poll_until
from handoff_mocker import MockerBackend


class WrongHolder:
    """Mixed in before a backend: its holder detector points at an idle worker of the target
    role instead of the busy one, consistently (asked about that worker alone, it says yes), so
    the case faults a worker that does not hold the request."""

    pool: list = []

    def holders(self, workers):
        if len(workers) > 1:
            self.pool = list(workers)
        busy = super().holders(self.pool)
        return [w for w in self.pool if w not in busy and w in workers] if busy else []


#: Runs before the worker: double-forks a child into its own session (out of the worker's
#: tree and group) that listens on the given port, writes its pid, then execs the worker. It
#: binds as servers do and as `ports.bindable` checks a lease (SO_REUSEADDR): without it, a
#: leased port with a connection of its last user in TIME_WAIT cannot be bound, and the
#: child writes no pid (the suspected cause of one child of two missing in a clean clone's suite).
DETACH = textwrap.dedent(
    """
    import os, socket, sys
    port, pidfile = int(sys.argv[1]), sys.argv[2]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
            with open(pidfile, "w") as f:
                f.write(str(os.getpid()))
            os.closerange(0, 3)
            while True:
                s.accept()[0].close()
        os._exit(0)
    os.wait()
    os.execv(sys.argv[3], sys.argv[3:])
    """
)


class DetachedChild:
    """Mixed in before a backend: each worker leases one more port and leaves a detached child
    listening on it, which writes its pid to a file named by that port (the workers share a
    folder)."""

    def ports_of(self, role):
        return (*super().ports_of(role), "stray")

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        pidfile = folder / f"stray-{ports['stray']}.pid"
        argv = [sys.executable, "-c", DETACH, str(ports["stray"]), str(pidfile), *launch.argv]
        return replace(launch, argv=argv)


def strays_under(folder) -> dict[int, int]:
    """The detached children the workers left, port -> pid, by the files they wrote."""
    return {
        int(path.stem.removeprefix("stray-")): int(path.read_text())
        for path in folder.rglob("stray-*.pid")
        if path.read_text()
    }


def kill_strays(folder) -> None:
    """SIGKILL the detached children under `folder` (the test's own, by their pid) and wait
    until they are gone: a killed process is not dead the moment kill() returns."""
    procs = []
    for pid in strays_under(folder).values():
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
            procs[-1].kill()

    def living(proc: psutil.Process) -> bool:
        try:
            return proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def gone() -> tuple[bool | None, list[int]]:
        alive = [p.pid for p in procs if living(p)]
        return (None if alive else True), alive

    poll_until(gone, Deadline(10), "the killed detached children to exit")


class HeldEngineGauge:
    """Mixed in before a backend with an engine gauge: each worker runs under
    tests/held_engine_gauge.py, which serves the worker's page on a port of its own with the
    engine's running gauge held at its highest, and the engine gauge is read there. An engine
    that ran the request goes on running it, as far as its gauge says; its handler's in-flight
    gauge, on the worker's own port, is the worker's."""

    def ports_of(self, role):
        return (*super().ports_of(role), "engine")

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        wrapper = str(Path(__file__).with_name("held_engine_gauge.py"))
        held = [wrapper, str(ports["engine"]), str(ports["system"]), self.engine_running_gauge]
        return replace(launch, argv=[sys.executable, *held, "--", *launch.argv])

    def engine_running(self, workers):
        ports = {w.name: w.ports["engine"] for w in workers}
        return metrics.worker_sums(ports, self.engine_running_gauge, required=True)


class WorkersWith(MockerBackend):
    """Workers launched with `env` on top of what the pool gives them."""

    def __init__(self, **env: str) -> None:
        super().__init__()
        self.env = env

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        return replace(launch, env={**launch.env, **self.env})
