"""Dynamo's Python processes forked from an interpreter that imported them once.

Importing Dynamo's frontend or mocker is most of what such a process costs to start
(benchmarks/RESULTS.md), and a case starts three to five of them. A pool starts one
`Preloader`: a warm interpreter (`handoff.machine.forkserver`) that imports the modules its
processes run, then forks each launch of `python -m MODULE`: the child takes the launch's
environment, session, nice value and log, and runs the module as `__main__`. The same code
runs; only the import is shared. The warm interpreter imports and does nothing else, so it
holds no thread and no connection to fork. A launch it could not reproduce (another module or
interpreter, or other interpreter settings: `INTERPRETER_PREFIXES`) is started with `exec`,
as without a preloader. What the interpreter's start did to its environment (the locale
coercion sets LC_CTYPE), a forked child's environment gets too."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from handoff.errors import HandoffError
from handoff.machine import forkserver, ownership
from handoff.polling import Deadline, Timeout, poll_until

#: What the interpreter reads when it starts, before any module runs (its settings, the
#: libraries the loader adds, the locale it coerces): a launch that sets them otherwise than
#: the preloader was started with is not forked from it.
INTERPRETER_PREFIXES = ("PYTHON", "LD_", "LC_", "LANG")
#: The exit code of a forked process that is gone where the preloader died before reporting it.
UNREPORTED_EXIT = -255
FOREVER_S = 10.0**9
#: How long a fork may take, the warm interpreter's import included (under 2 s on a busy
#: 2-core machine): past it, the warm interpreter is stuck.
SPAWN_TIMEOUT_S = 60.0


def interpreter_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(INTERPRETER_PREFIXES)}


class Forked:
    """A process the preloader forked: the part of `subprocess.Popen` that handoff uses."""

    def __init__(self, pid: int, preloader: Preloader) -> None:
        self.pid = pid
        self._preloader = preloader
        try:
            self._process: psutil.Process | None = psutil.Process(pid)
        except psutil.NoSuchProcess:  # reaped already
            self._process = None

    def poll(self) -> int | None:
        """Its exit code once the preloader reaped it; `UNREPORTED_EXIT` once it is gone where
        the preloader died first."""
        code = self._preloader.exit_code(self.pid)
        if code is None and self._preloader.gone() and not self._running():
            return UNREPORTED_EXIT
        return code

    def _running(self) -> bool:
        try:
            return self._process is not None and self._process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def wait(self, timeout: float | None = None) -> int:
        try:
            return poll_until(
                lambda: (self.poll(), "running"),
                Deadline(FOREVER_S if timeout is None else timeout),
                f"pid {self.pid} to exit",
            )
        except Timeout:
            raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0) from None


class Preloader:
    """One warm interpreter for a pool; `spawn` forks a launch from it, `stop` ends it once
    everything it forked is gone."""

    def __init__(self, modules: Mapping[str, str], env: Mapping[str, str], log_path: Path) -> None:
        #: The module a launch runs (`python -m` it) -> the module that imports what it needs.
        self.modules = dict(modules)
        self.env = dict(env)
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self._exits: dict[int, int] = {}
        self._forked: list[int] = []
        self._changed = threading.Condition()
        self._spawning = threading.Lock()

    def serves(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether `argv` with `env` would start the same interpreter running one of the
        modules already imported."""
        return (
            len(argv) > 2
            and list(argv[:2]) == [sys.executable, "-m"]
            and argv[2] in self.modules
            and interpreter_env(env) == interpreter_env(self.env)
        )

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", forkserver.__name__, *self.modules.values()],
                env={**self.env, ownership.MARK_ENV: ownership.mark()},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        ownership.record(self.popen.pid, "preloader")
        threading.Thread(target=self._read, name="preloader-reader", daemon=True).start()

    @property
    def pid(self) -> int:
        assert self.popen is not None, "the preloader was never started"
        return self.popen.pid

    def _read(self) -> None:
        assert self.popen is not None and self.popen.stdout is not None
        for line in self.popen.stdout:
            event = json.loads(line)
            with self._changed:
                if "exited" in event:
                    self._exits[event["exited"]] = event["code"]
                else:
                    self._forked.append(event["pid"])
                self._changed.notify_all()
        with self._changed:
            self.popen.wait()
            self._changed.notify_all()

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, niceness: int
    ) -> Forked:
        """Fork `argv` (`python -m MODULE ARGS`) with exactly `env`, in a session of its own,
        its output appended to `log_path`."""
        assert self.popen is not None and self.popen.stdin is not None
        request = {"argv": list(argv[2:]), "env": dict(env), "log": str(log_path)}
        with self._spawning, self._changed:
            known = len(self._forked)
            try:
                self.popen.stdin.write(json.dumps({**request, "niceness": niceness}).encode())
                self.popen.stdin.write(b"\n")
                self.popen.stdin.flush()
            except BrokenPipeError:
                pass  # said below, with its log
            forked = lambda: len(self._forked) > known or self.gone()  # noqa: E731
            if not self._changed.wait_for(forked, SPAWN_TIMEOUT_S):
                raise HandoffError(
                    f"the preloader (pid {self.popen.pid}) did not fork {argv[2]} within "
                    f"{SPAWN_TIMEOUT_S:g} s: see {self.log_path}"
                )
            if len(self._forked) == known:
                raise HandoffError(
                    f"the preloader (pid {self.popen.pid}) exited before forking "
                    f"{argv[2]}: see {self.log_path}"
                )
            return Forked(self._forked[known], self)

    def gone(self) -> bool:
        return self.popen is not None and self.popen.poll() is not None

    def exit_code(self, pid: int) -> int | None:
        """What it reported of `pid`'s exit; None before that."""
        with self._changed:
            return self._exits.get(pid)

    def stop(self, timeout_s: float) -> list[str]:
        """Close its stdin and wait for it to exit (it reaps its children first: call this once
        they are killed); SIGKILL it if it does not. The problems found; empty means clean."""
        if self.popen is None:
            return []
        with contextlib.suppress(BrokenPipeError):
            assert self.popen.stdin is not None
            self.popen.stdin.close()
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            living = [pid for pid in self._forked if pid not in self._exits]
            return [f"the preloader (pid {self.popen.pid}) outlived its stop: its children "
                    f"{living} were not reaped; killed"]  # fmt: skip
        ownership.forget(self.popen.pid)
        return []
