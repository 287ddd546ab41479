"""What a test left running: every process handoff started for it carries the test's mark
(handoff.machine.ownership.MARK_ENV), so it is found wherever it went, a detached grandchild
in a session of its own and re-parented to init included, where the test's own process tree
no longer reaches it."""

from __future__ import annotations

import contextlib
import os

import psutil

from handoff.machine.ownership import MARK_ENV
from handoff.machine.ports import bindable, listener


def marked(value: str) -> list[psutil.Process]:
    """The running processes whose environment carries `value` as handoff's mark."""
    found = []
    for proc in running(list(psutil.process_iter())):
        # Another user's process, or one gone meanwhile, is none of ours.
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(MARK_ENV) == value:
                found.append(proc)
    return found


def running(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `processes` still running: a zombie has exited, and only waits to be reaped."""
    alive = []
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
    return alive


def reap(processes: list[psutil.Process]) -> None:
    """SIGKILL a test's own leftover processes (by pid) and wait until they are gone."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            process.kill()
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert alive == [], f"processes that outlived their SIGKILL by 30 s: {alive}"


def name_of(process: psutil.Process) -> str:
    """Its name, or why it has none to give (gone meanwhile, or another user's)."""
    try:
        return process.name()
    except psutil.Error as exc:
        return type(exc).__name__


def ports_held(ports: list[int]) -> dict[int, str]:
    """Those of `ports` that a process carrying this test's mark still listens on, each with its
    holder. Once a case released its leases another test may lease and bind the same port: a
    listener that carries another mark is not this test's, one that cannot be read may be."""
    mine = os.environ.get(MARK_ENV)
    held = {}
    for port in ports:
        if bindable(port):
            continue
        pids = {c.pid for c in psutil.net_connections(kind="tcp") if listens_on(c, port)}
        if not pids or any(carries(pid) in (mine, None) for pid in pids):
            held[port] = listener(port)
    return held


def listens_on(conn, port: int) -> bool:
    return bool(conn.laddr) and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN


def carries(pid: int | None) -> str | None:
    """The mark `pid` carries ('' for none); None where it cannot be read."""
    if pid is None:  # another user's
        return None
    try:
        return psutil.Process(pid).environ().get(MARK_ENV, "")
    except psutil.Error:
        return None
