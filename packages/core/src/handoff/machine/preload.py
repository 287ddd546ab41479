"""Dynamo's Python processes forked from an interpreter that imported them once.

Importing Dynamo's frontend or mocker is most of what such a process costs to start
(benchmarks/RESULTS.md), and a case starts three to five of them. A pool starts one
`Preloader`: warm interpreters (`handoff.machine.forkserver`) that import what its processes
run, one a module, then fork each launch of `python -m MODULE`: the child takes the launch's
environment, session, nice value and log, and runs the module as `__main__`. The same code
runs; only the import is shared. A warm interpreter imports and does nothing else, so it holds
no thread (checked) and no connection to fork. What the interpreter's start and the module's
import did to the environment (the locale coercion sets LC_CTYPE; the mocker's import sets
DYN_COMPUTE_THREADS), a child of that module gets, as its own import would have done. A launch
it could not reproduce is started with `exec`, as without a preloader: another module or
interpreter, other interpreter settings (`INTERPRETER_PREFIXES`), or another value of any
variable the module's import read."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from handoff.errors import HandoffError
from handoff.machine import forkserver, ownership
from handoff.machine.polling import Deadline, Timeout, poll_until

#: What the interpreter reads when it starts, before any module runs (its settings, the
#: libraries the loader adds, the locale it coerces): a launch that sets them otherwise than
#: the preloader was started with is not forked from it.
INTERPRETER_PREFIXES = ("PYTHON", "LD_", "LC_", "LANG")
#: The exit code of a forked process that is gone where the preloader died before reporting it.
UNREPORTED_EXIT = -255
FOREVER_S = 10.0**9
#: How long an import or a fork may take (under 2 s on a busy 2-core machine): past it, the
#: warm interpreter is stuck.
SPAWN_S = 60.0


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
        """Alive, and still the process forked (psutil checks its start time)."""
        try:
            process = self._process
            return (
                process is not None
                and process.is_running()
                and process.status() != psutil.STATUS_ZOMBIE
            )
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
    """One pool's warm interpreters; `spawn` forks a launch from them, `stop` ends them once
    everything they forked is gone."""

    def __init__(
        self, modules: Mapping[str, str], base: Sequence[str], env: Mapping[str, str], log: Path
    ) -> None:
        #: The module a launch runs (`python -m` it) -> the module that imports what it needs.
        self.modules = dict(modules)
        #: What every one of them imports, imported once for all (it must not touch the
        #: environment: the warm interpreter exits saying so where it does).
        self.base = tuple(base)
        self.env = dict(env)
        self.log_path = log
        self.popen: subprocess.Popen[bytes] | None = None
        #: Module -> the variables its import read, or why it could not be imported.
        self._imported: dict[str, list[str] | str] = {}
        self._pids: dict[int, int] = {}  # request id -> pid
        self._exits: dict[int, int] = {}
        self._abandoned: set[int] = set()
        self._ids = itertools.count()
        self.broken: str | None = None
        self._changed = threading.Condition()

    def serves(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether `argv` with `env` would start the same interpreter, reading the same
        variables at import, running a module imported already."""
        if not (
            len(argv) > 2
            and list(argv[:2]) == [sys.executable, "-m"]
            and argv[2] in self.modules
            and interpreter_env(env) == interpreter_env(self.env)
        ):
            return False
        with self._changed:
            self._changed.wait_for(lambda: argv[2] in self._imported or self.gone(), SPAWN_S)
            reads = self._imported.get(argv[2])
        return isinstance(reads, list) and all(env.get(k) == self.env.get(k) for k in reads)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        served = [f"{module}={imported}" for module, imported in self.modules.items()]
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", forkserver.__name__, *self.base, "--", *served],
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

    def tree(self) -> list[psutil.Process]:
        """Its warm interpreters (one a module, its children) and what they forked; none once
        it is gone."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _read(self) -> None:
        """Take in its events until it exits; a line it cannot read breaks it (every exit
        code is then unknown), never taken for an answer."""
        assert self.popen is not None and self.popen.stdout is not None
        try:
            for line in self.popen.stdout:
                with self._changed:
                    self._take(json.loads(line))
                    self._changed.notify_all()
        except (ValueError, KeyError, OSError) as exc:
            self.broken = f"its events could not be read ({exc!r})"
        with self._changed:
            self.popen.wait()
            self._changed.notify_all()

    def _take(self, event: dict) -> None:
        if "module" in event:
            self._imported[event["module"]] = event.get("reads", event.get("error", "?"))
        elif "exited" in event:
            self._exits[event["pid"]] = event["exited"]
        elif event["id"] in self._abandoned:  # forked after its spawn gave up: not ours to run
            with contextlib.suppress(ProcessLookupError):
                os.killpg(event["pid"], signal.SIGKILL)
        else:
            self._pids[event["id"]] = event["pid"]

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, niceness: int
    ) -> Forked:
        """Fork `argv` (`python -m MODULE ARGS`, `serves` it) with exactly `env`, in a session
        of its own, its output appended to `log_path`."""
        assert self.popen is not None and self.popen.stdin is not None
        key = next(self._ids)
        request = {"id": key, "argv": list(argv[2:]), "env": dict(env), "log": str(log_path)}
        with self._changed:
            try:
                self.popen.stdin.write(json.dumps({**request, "niceness": niceness}).encode())
                self.popen.stdin.write(b"\n")
                self.popen.stdin.flush()
            except BrokenPipeError:
                pass  # said below, with its log
            if not self._changed.wait_for(lambda: key in self._pids or self.gone(), SPAWN_S):
                self._abandoned.add(key)
                raise HandoffError(
                    f"the preloader (pid {self.popen.pid}) did not fork {argv[2]} within "
                    f"{SPAWN_S:g} s: see {self.log_path}"
                )
            if key not in self._pids:
                raise HandoffError(
                    f"the preloader (pid {self.popen.pid}) exited before forking "
                    f"{argv[2]}{f', {self.broken}' if self.broken else ''}: see {self.log_path}"
                )
            return Forked(self._pids[key], self)

    def gone(self) -> bool:
        """Whether it has exited, or its events can no longer be read."""
        return self.broken is not None or (self.popen is not None and self.popen.poll() is not None)

    def exit_code(self, pid: int) -> int | None:
        """What it reported of `pid`'s exit; None before that."""
        with self._changed:
            return self._exits.get(pid)

    def stop(self, timeout_s: float) -> list[str]:
        """Close its stdin and wait for it to exit (it reaps its children first: call this once
        they are killed); SIGKILL its interpreters if they do not. The problems found; empty
        means clean."""
        if self.popen is None:
            return []
        with contextlib.suppress(BrokenPipeError):
            assert self.popen.stdin is not None
            self.popen.stdin.close()
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)  # the module interpreters are in it
            self.popen.wait()
            living = sorted(set(self._pids.values()) - set(self._exits))
            return [f"the preloader (pid {self.popen.pid}) outlived its stop: its children "
                    f"{living} were not reaped; killed"]  # fmt: skip
        ownership.forget(self.popen.pid)
        return []
