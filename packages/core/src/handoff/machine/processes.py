"""Processes handoff starts: own process group, own log file, signalled only by pid or group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

import psutil

from handoff.errors import HandoffError
from handoff.machine import ownership
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.machine.preload import Forked, Preloader


class ManagedProcess:
    """A process started by handoff, in its own session so its whole tree can be signalled."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        niceness: int = 0,
        preloader: Preloader | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.niceness = niceness
        #: Where the process is forked from when it can be (`Preloader.serves`).
        self.preloader = preloader
        self.popen: subprocess.Popen[bytes] | Forked | None = None
        self.started_at: float | None = None  # monotonic
        self._known: dict[int, psutil.Process] = {}

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**self.env, ownership.MARK_ENV: ownership.mark()}
        if self.preloader is not None and self.preloader.serves(self.argv, env):
            self.popen = self.preloader.spawn(self.argv, env, self.log_path, self.niceness)
        else:
            self.popen = self._exec(env)
        self.started_at = time.monotonic()
        with contextlib.suppress(psutil.NoSuchProcess):  # forked, it may be reaped already
            self._known[self.popen.pid] = psutil.Process(self.popen.pid)
        ownership.record(self.popen.pid, self.name)

    def _exec(self, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            try:
                return subprocess.Popen(
                    self.argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    # Set in the child before exec, so every thread and child it makes inherits it.
                    preexec_fn=partial(os.nice, self.niceness) if self.niceness else None,
                )
            except FileNotFoundError as exc:
                raise HandoffError(
                    f"cannot start {self.name}: {self.argv[0]} not found; install it"
                ) from exc

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def exit_code(self) -> int | None:
        """None while running (or never started)."""
        return None if self.popen is None else self.popen.poll()

    def tree(self) -> list[psutil.Process]:
        """This process and its descendants that are still alive, remembered across calls.

        Descendants are remembered so that children orphaned by the parent's death are still
        found later: they are ours because we saw them under our pid. So are the members of
        our process group, which children keep when their parent dies before we saw them (a
        SIGKILLed dynamo.vllm leaves its VLLM::EngineCore running, re-parented to init).
        """
        leader = self._known.get(self.pid) if self.popen is not None else None
        if leader is not None and self.popen.poll() is None:
            try:
                for child in leader.children(recursive=True):
                    self._known.setdefault(child.pid, child)
            except psutil.NoSuchProcess:
                pass
        for member in self._group():
            self._known.setdefault(member.pid, member)
        return [p for p in self._known.values() if self.alive(p)]

    def _owns_group(self) -> bool:
        """Is the group we created (start_new_session: its id is our pid) still ours? Yes while
        our leader is alive, or gone with no process reusing its pid (Linux never hands out a
        pid that a living group still uses as its id)."""
        if self.popen is None:
            return False
        return self.popen.poll() is None or not psutil.pid_exists(self.pid)

    def _group(self) -> list[psutil.Process]:
        return group_members(self.pid) if self._owns_group() else []

    def alive(self, proc: psutil.Process) -> bool:
        """Our own child counts until it is reaped: a killed multi-threaded process shows as a
        zombie while its other threads still hold its sockets. Descendants count until zombie."""
        if self.popen is not None and proc.pid == self.popen.pid:
            return self.popen.poll() is None
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def signal_tree(self, sig: signal.Signals) -> None:
        for proc in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)  # psutil refuses if the pid was reused by another process

    def signal_leader(self, sig: signal.Signals) -> bool:
        """`sig` to the leader alone, with no look at /proc first (on a busy machine listing
        its processes takes seconds); psutil refuses a pid reused by another process. Whether
        it went out: False where the leader had ended."""
        leader = self._known.get(self.pid)
        if leader is None or not self.alive(leader):
            return False
        try:
            leader.send_signal(sig)
        except psutil.NoSuchProcess:
            return False
        return True

    def freeze(self, deadline: Deadline) -> None:
        """SIGSTOP the tree and wait until every thread of it is stopped. kill() returns once
        the signal is queued: on a busy machine the thread chosen to stop the group may wait for
        a core while another thread, already running, still answers a request."""
        self.stop_now()
        self.signal_tree(signal.SIGSTOP)  # a descendant not seen before

        await_stopped(self.tree, deadline, f"{self.name} (pid {self.pid})")

    def stop_now(self, sig: signal.Signals = signal.SIGSTOP) -> None:
        """`sig` to the group and to every process of the tree seen so far, before any look at
        /proc for others: on a busy machine listing its processes takes seconds, in which a
        running worker would end what it holds."""
        if self._owns_group():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)
        for proc in list(self._known.values()):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)

    def wait_gone(self, deadline: Deadline) -> list[psutil.Process]:
        """Wait until the whole tree has exited (and is reaped); return what is alive at the end.
        While the leader runs, the tree is not gone: its exit status is read, not /proc, which
        a busy machine reads slowly (every look at the tree lists its processes)."""

        def probe() -> tuple[bool | None, str]:
            if self.exit_code() is None and self.popen is not None:
                return None, f"pid {self.pid} running"
            return (True, "") if not (alive := self.tree()) else (None, _pids(alive))

        with contextlib.suppress(Timeout):
            poll_until(probe, deadline, f"{self.name} (pid {self.pid}) and its children to exit")
        alive = self.tree()
        if not alive:
            ownership.forget(self.pid)
        return alive

    def exited_within(self, deadline: Deadline) -> bool:
        """Whether the leader was seen exited before `deadline`, by its exit status alone: what
        a bound decides is the state at the bound. An exit first seen once the deadline had
        passed (a poll woken late on a loaded machine) is not within it."""

        def probe() -> tuple[bool | None, str]:
            late = deadline.expired()  # read before the status: an exit seen then is in time
            return (not late if self.exit_code() is not None else None), "running"

        try:
            return poll_until(probe, deadline, f"{self.name} (pid {self.pid}) to exit")
        except Timeout:
            return False

    def kill(self) -> None:
        """SIGKILL the tree and its process group; `wait_gone` then waits for them."""
        self.tree()  # remember the descendants before the parent can orphan them
        self.stop_now(signal.SIGKILL)
        self.signal_tree(signal.SIGKILL)

    def exit_code_within(self, seconds: float) -> int | None:
        """The exit code, waiting up to `seconds` for a process that is on its way out."""
        assert self.popen is not None, f"{self.name} was never started"
        try:
            return self.popen.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def state(self) -> str:
        """The process's state as the kernel reports it: running, sleeping, stopped..."""
        try:
            return self._known[self.pid].status()
        except (KeyError, psutil.Error):
            return "gone"

    def cpu_seconds(self) -> float | None:
        """User and system CPU time the process used so far; None once it is gone."""
        try:
            used = self._known[self.pid].cpu_times()
        except (KeyError, psutil.Error):
            return None
        return used.user + used.system

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def group_members(group: int) -> list[psutil.Process]:
    """The living processes whose process group is `group`."""
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == group:
                members.append(proc)
    return members


def _pids(procs: list[psutil.Process]) -> str:
    return "pids " + ", ".join(str(p.pid) for p in procs)


def await_stopped(procs: Callable[[], list[psutil.Process]], deadline: Deadline, what: str) -> None:
    """Until every thread of each of `procs()` is stopped (state T): a SIGSTOP is queued, and
    on a busy machine a thread already running may still answer, or stream, meanwhile."""

    def probe() -> tuple[bool | None, str]:
        running = [
            f"thread {tid} of pid {proc.pid} is {state}"
            for proc in procs()
            for tid, state in _thread_states(proc)
            if state not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
        ]
        return (None if running else True), "; ".join(running[:3])

    poll_until(probe, deadline, f"every thread of {what} to stop")


def _thread_states(proc: psutil.Process) -> list[tuple[int, str]]:
    """(thread id, kernel state) of each of the process's threads; none once it is gone."""
    states = []
    with contextlib.suppress(psutil.Error):
        for thread in proc.threads():
            with contextlib.suppress(psutil.Error):
                states.append((thread.id, psutil.Process(thread.id).status()))
    return states
