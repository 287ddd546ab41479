"""The warm interpreters that `handoff.machine.preload` starts. The first imports what every
served module imports (its base, which must leave the environment as it found it), then forks
one warm interpreter per served module: that one imports the module, noting what the import
did to the environment and which variables it read, and forks each launch of the module on
request. Standard library only, so that a forked process holds nothing of handoff's.

    python -m handoff.machine.forkserver BASE_MODULE... -- MODULE=IMPORTED_MODULE...

A request on stdin is `{"id": N, "argv": [MODULE, ARG...], "env": {...}, "log": PATH,
"niceness": N}`. Events on stdout, one JSON line each: `{"module": M, "reads": [...]}` once
a module is imported (or `{"module": M, "error": ...}`), `{"id": N, "pid": P}` once forked,
`{"pid": P, "exited": C}` once reaped (C as `subprocess.Popen.returncode` gives it). Every
interpreter exits once its requests end and its last child is reaped; anything printed goes
to stderr, the log."""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import sys

Changes = tuple[dict[str, str], list[str]]


def given_env() -> dict[str, str]:
    """The environment this process was started with (its exec's, which `setenv` leaves)."""
    with open("/proc/self/environ", "rb") as environ:
        pairs = [entry.split(b"=", 1) for entry in environ.read().split(b"\0") if b"=" in entry]
    return {os.fsdecode(k): os.fsdecode(v) for k, v in pairs}


def changed_env(before: dict[str, str]) -> Changes:
    """What happened to the environment since `before`: set and removed."""
    changed = {k: v for k, v in os.environ.items() if before.get(k) != v}
    return changed, [k for k in before if k not in os.environ]


def imported_reading(module: str) -> set[str]:
    """Import `module`, noting every variable read from `os.environ` meanwhile (`os.getenv`
    and `setdefault` read through it; present or not)."""
    environ, read = type(os.environ), set()
    plain = environ.__getitem__

    def noting(self, key):
        read.add(key)
        return plain(self, key)

    environ.__getitem__ = noting
    try:
        importlib.import_module(module)
    finally:
        environ.__getitem__ = plain
    return read


def become(request: dict, changes: list[Changes]) -> None:
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
    for changed, removed in changes:
        os.environ.update(changed)
        for name in removed:
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


def say(events: int, event: dict) -> None:
    os.write(events, (json.dumps(event) + "\n").encode())


def fork(request: dict, changes: list[Changes]) -> int:
    """Fork the child for `request`; return once it has its session and its output, as
    `subprocess.Popen` returns once its child has."""
    settled, told = os.pipe()
    if (pid := os.fork()) == 0:
        become(request, changes)
    os.close(told)
    os.read(settled, 1)  # end of file once the child closed its descriptors
    os.close(settled)
    return pid


def lines(fd: int, pending: bytearray) -> list[bytes] | None:
    """The whole lines read from `fd`; None at its end."""
    chunk = os.read(fd, 65536)
    if not chunk:
        return None
    pending += chunk
    *whole, rest = bytes(pending).split(b"\n")
    pending[:] = rest
    return whole


def serve_module(module: str, imported: str, requests: int, events: int, changes: Changes):
    """One module's warm interpreter: import it, say so, then fork a child a request until
    the requests end and every child is reaped."""
    before = dict(os.environ)
    try:
        reads = imported_reading(imported)
        if (threads := len(os.listdir("/proc/self/task"))) != 1:
            raise RuntimeError(f"importing {imported} started {threads - 1} thread(s)")
    except Exception as exc:
        say(events, {"module": module, "error": f"{type(exc).__name__}: {exc}"})
        return
    mine = [changes, changed_env(before)]
    say(events, {"module": module, "reads": sorted(reads)})
    children: dict[int, int] = {}  # pidfd -> pid
    pending, reading = bytearray(), True
    while reading or children:
        ready, _, _ = select.select([*children, *([requests] if reading else [])], [], [])
        for fd in ready:
            if fd != requests:
                pid = children.pop(fd)
                os.close(fd)
                say(events, {"pid": pid, "exited": returncode(os.waitpid(pid, 0)[1])})
            elif (got := lines(requests, pending)) is None:
                reading = False
            else:
                for line in got:
                    request = json.loads(line)
                    pid = fork(request, mine)
                    children[os.pidfd_open(pid)] = pid
                    say(events, {"id": request["id"], "pid": pid})


def serve(base: list[str], served: dict[str, str]) -> None:
    events = os.dup(1)
    os.dup2(2, 1)  # what an import prints goes to the log, not among the events
    given = given_env()
    started = changed_env(given)  # the interpreter's own start: the locale coercion
    before = dict(os.environ)
    for module in base:
        importlib.import_module(module)
    if (changed := changed_env(before)) != ({}, []):
        sys.exit(f"importing {', '.join(base)} changed the environment: {changed}")
    pipes: dict[str, int] = {}
    servers = []
    for module, imported in served.items():
        requests, pipes[module] = os.pipe()
        if (pid := os.fork()) == 0:
            for other in pipes.values():
                os.close(other)
            serve_module(module, imported, requests, events, started)
            sys.exit(0)
        os.close(requests)
        servers.append(pid)
    pending = bytearray()
    while (got := lines(0, pending)) is not None:
        for line in got:
            os.write(pipes[json.loads(line)["argv"][0]], line + b"\n")
    for fd in pipes.values():
        os.close(fd)
    for pid in servers:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    split = sys.argv.index("--")
    served = dict(pair.split("=", 1) for pair in sys.argv[split + 1 :])
    serve(sys.argv[1:split], served)
