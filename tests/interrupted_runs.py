"""A qualification run in its own pytest process, with its own process records, port leases
and logs, that a test can interrupt (Ctrl-C, SIGTERM) or kill mid-case, then check that
nothing the run started is alive, every lease is free, and the next run starts clean. Shared by
the mocker's interrupt tests and the vLLM CPU engine's."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from handoff.machine.polling import Deadline, poll_until
from handoff.machine.ports import bindable, listener
from handoff.machine.worker_logs import ANSI


def hears_ctrl_c() -> None:
    """`preexec_fn` of a run a test interrupts: Ctrl-C at its default, so that Python raises
    KeyboardInterrupt in it, even where the suite itself was started ignoring it (a shell's
    background job, nohup), which a child would otherwise inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class IsolatedRuns:
    def __init__(self, tmp_path: Path, case: str, backend_args: list[str], timeout_s: float):
        self.folders = {name: tmp_path / name for name in ("records", "leases", "runs")}
        self.env = {
            **os.environ,
            "HANDOFF_STATE_DIR": str(self.folders["records"]),
            "HANDOFF_PORT_LEASES": str(self.folders["leases"]),
        }
        self.topology, self.case = case.split("/")
        self.backend_args = backend_args
        self.timeout_s = timeout_s

    def pytest(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification",
                "-p", "no:cacheprovider", *self.backend_args, *args]  # fmt: skip

    def start(self, *args: str) -> subprocess.Popen[str]:
        command = self.pytest(
            "--handoff-logs", str(self.folders["runs"]), "-k", self.case,
            "--handoff-topology", self.topology, *args,
        )  # fmt: skip
        return subprocess.Popen(
            command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=hears_ctrl_c,
        )  # fmt: skip

    def recorded(self) -> dict[int, float]:
        return {entry["pid"]: entry["started"] for entry in self.entries()}

    def entries(self) -> list[dict]:
        out = []
        for path in self.folders["records"].glob("*.json"):
            try:
                out.append(json.loads(path.read_text()))
            except ValueError:
                continue  # being written
        return out

    def wait_for_deployment(self) -> dict[int, float]:
        """The case's frontend is recorded: it starts once the workers are ready, so the case
        is in its middle (a signal sent on a count of processes once came after a vLLM case
        had ended: its workers and their engines start long before the case's request)."""

        def frontend() -> tuple[dict[int, float] | None, list[str]]:
            names = [entry["name"] for entry in self.entries()]
            return (self.recorded() if "frontend" in names else None), names

        return poll_until(frontend, Deadline(self.timeout_s), "the case's frontend to start")

    def wait_for_log(
        self, run: subprocess.Popen[str], pattern: str, *words: str
    ) -> dict[int, float]:
        """Wait until a log of `run` named by `pattern` (a glob under its logs folder) has a
        line with every one of `words` (colours stripped): a moment mid-case to signal the run
        at. The processes recorded then."""

        def logged() -> tuple[dict[int, float] | None, list[str]]:
            if run.poll() is not None:
                raise AssertionError(f"the run ended first: {run.communicate()[0][-3000:]}")
            logs = sorted(self.folders["runs"].rglob(pattern))
            for path in logs:
                lines = ANSI.sub("", path.read_text(errors="replace")).splitlines()
                if any(all(word in line for word in words) for line in lines):
                    return self.recorded(), []
            return None, [path.name for path in logs]

        awaited = f"a line with {list(words)} in the run's {pattern}"
        return poll_until(logged, Deadline(self.timeout_s), awaited)

    def discovery_entries(self) -> list[Path]:
        """The entries the run's workers have in a discovery folder (a pool's, or a spare's
        own) under its logs folder."""
        runs = self.folders["runs"]
        return [
            path
            for path in runs.rglob("*")
            if path.is_file() and any(p.endswith("discovery") for p in path.relative_to(runs).parts)
        ]

    def data_folders(self) -> list[Path]:
        """The data folders the run's services own (etcd's, `ownership.own_folder`)."""
        return sorted(p for p in (self.folders["records"] / "folders").glob("*") if p.is_dir())

    def assert_clean(self, started: dict[int, float]) -> None:
        assert not [p for p, t in started.items() if alive(p, t)], "processes left running"
        assert self.recorded() == {}
        assert list((self.folders["records"] / "folders").glob("*")) == []  # nor their records
        leases = list(self.folders["leases"].glob("*.lock"))
        assert leases, "the run leased no port"
        for lock in leases:
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody holds the lease
            finally:
                os.close(fd)

        def bound() -> tuple[bool | None, dict[int, str]]:
            """A SIGKILLed multi-threaded process frees its sockets as its threads exit, a
            moment after the reaper's kill: poll, and name whoever still listens. A port that
            a process of another test took once the run let it go is not the run's: the run
            leased from a folder of its own, which the other tests do not see, and every
            process it starts, recorded or not, inherits that folder in its environment."""
            busy = [
                int(lock.stem)
                for lock in leases
                if not bindable(int(lock.stem)) and self.owns(listening_pid(int(lock.stem)))
            ]
            return (None if busy else True), {port: listener(port) for port in busy}

        poll_until(bound, Deadline(15), "the run's leased ports to be bindable again")

    def owns(self, pid: int | None) -> bool:
        """Whether `pid` is a process of this run, or cannot be told apart from one (unseen,
        or gone before its environment was read)."""
        if pid is None:
            return True
        try:
            leases = psutil.Process(pid).environ().get("HANDOFF_PORT_LEASES")
        except psutil.Error:
            return True
        return leases == str(self.folders["leases"])

    def kill_and_reap(self, run: subprocess.Popen[str], started: dict[int, float]) -> list[str]:
        """SIGKILL the run (no teardown at all), check its processes outlive it, let the next
        run's start reap them, and wait until they are gone; the reaper's lines (processes
        killed, then nftables tables deleted)."""
        run.kill()
        run.communicate(timeout=30)
        assert all(alive(p, t) for p, t in started.items())
        after = subprocess.run(
            self.pytest("--collect-only", "-q"), env=self.env, capture_output=True, text=True,
            timeout=self.timeout_s,
        )  # fmt: skip
        lines = after.stdout.splitlines()
        killed = [line for line in lines if line.startswith("handoff: killed ")]
        assert killed, after.stdout[-2000:]
        killed += [
            line for line in lines if line.startswith(("handoff: deleted ", "handoff: removed "))
        ]
        poll_until(
            lambda: (
                (True, None)
                if not (left := [p for p, t in started.items() if alive(p, t)])
                else (None, left)
            ),
            Deadline(15),
            "the reaped processes to exit",
        )
        return killed

    def next_run_is_clean(self) -> None:
        run = self.start()
        out, _ = run.communicate(timeout=self.timeout_s * 2)
        assert run.returncode == 0, out[-3000:]
        assert "left running by a run that no longer exists" not in out
        assert "1 passed" in out
        assert self.data_folders() == []


def alive(pid: int, started: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def listening_pid(port: int) -> int | None:
    """The pid that listens on `port`, None where none does (or it cannot be seen)."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            return conn.pid
    return None
