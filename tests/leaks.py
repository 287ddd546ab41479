"""What a test left running: every process handoff started for it carries the test's mark
(handoff.machine.ownership.MARK_ENV), so it is found wherever it went, a detached grandchild
in a session of its own and re-parented to init included, where the test's own process tree
no longer reaches it."""

from __future__ import annotations

import contextlib

import psutil

from handoff.machine.ownership import MARK_ENV


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
