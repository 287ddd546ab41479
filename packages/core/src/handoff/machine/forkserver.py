"""The warm interpreter that `handoff.machine.preload` starts: it imports the modules it is
given, then forks one process per request line on stdin, and says on stdout what it forked and
how each child exited. Standard library only, so that a forked process holds nothing of
handoff's.

    python -m handoff.machine.forkserver MODULE_TO_IMPORT...

A request is `{"argv": [MODULE, ARG...], "env": {...}, "log": PATH, "niceness": N}`; the
events are `{"pid": N}` once forked, then `{"exited": N, "code": C}` once reaped (C as
`subprocess.Popen.returncode` gives it). It exits once stdin is closed and its last child is
reaped."""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import sys


def given_env() -> dict[str, str]:
    """The environment this process was started with (its exec's, which `setenv` leaves)."""
    with open("/proc/self/environ", "rb") as environ:
        pairs = [entry.split(b"=", 1) for entry in environ.read().split(b"\0") if b"=" in entry]
    return {os.fsdecode(k): os.fsdecode(v) for k, v in pairs}


def changed_env(given: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """What the interpreter's start and the imports did to the environment they were given
    (the locale coercion sets LC_CTYPE): set and removed, for each child to do the same."""
    changed = {k: v for k, v in os.environ.items() if given.get(k) != v}
    return changed, [k for k in given if k not in os.environ]


def become(request: dict, changes: tuple[dict[str, str], list[str]]) -> None:
    """In the forked child: take the launch's session, nice value, output and environment
    (closing every other descriptor tells the server it has), then run its module as
    `python -m` does; never returns."""
    os.setsid()
    if request["niceness"]:
        os.nice(request["niceness"])
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(changes[0])
    for name in changes[1]:
        os.environ.pop(name, None)
    module, *args = request["argv"]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    # Out through the interpreter's own exit, as `python -m` ends: what the module raised or
    # SystemExit unwinds past the server's frames, then atexit handlers and finalization run.
    sys.exit(0)


def returncode(status: int) -> int:
    """As `subprocess.Popen.returncode` gives it: minus the signal for a killed process."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def say(event: dict) -> None:
    os.write(1, (json.dumps(event) + "\n").encode())


def fork(request: dict, changes: tuple[dict[str, str], list[str]]) -> int:
    """Fork the child for `request`; return once it has its session and its output, as
    `subprocess.Popen` returns once its child has."""
    settled, told = os.pipe()
    if (pid := os.fork()) == 0:
        become(request, changes)
    os.close(told)
    os.read(settled, 1)  # end of file once the child closed its descriptors
    os.close(settled)
    return pid


def serve(imports: list[str]) -> None:
    given = given_env()
    for module in imports:
        importlib.import_module(module)
    changes = changed_env(given)
    print(f"imported {', '.join(imports)}; forking on request", file=sys.stderr, flush=True)
    children: dict[int, int] = {}  # pidfd -> pid
    pending, reading = b"", True
    while reading or children:
        ready, _, _ = select.select([*children, *([0] if reading else [])], [], [])
        for fd in ready:
            if fd != 0:
                pid = children.pop(fd)
                os.close(fd)
                say({"exited": pid, "code": returncode(os.waitpid(pid, 0)[1])})
                continue
            chunk = os.read(0, 65536)
            reading = bool(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                pid = fork(json.loads(line), changes)
                children[os.pidfd_open(pid)] = pid
                say({"pid": pid})


if __name__ == "__main__":
    serve(sys.argv[1:])
