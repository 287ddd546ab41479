"""What this machine's handoff runs started, so that a run killed before its teardown (SIGKILL,
a crashed pytest worker) leaves nothing running for long: the next run reaps it.

Every process handoff starts is recorded in a file named by its pid, with its start time and
the pid and start time of the process that owns it (the pytest process that started it). A
record is dropped once the process is gone. A record whose owner no longer exists is an orphan:
`reap_orphans` kills the recorded process group, and only if the recorded process is still the
same one (same start time), or is gone while members of its group live on (children of a
SIGKILLed parent keep its group, and Linux hands out no pid that a living group uses as its
id), never by name. Records of a live owner (another run going on at the same time) are left
alone.

A data folder a service writes (etcd's) is owned the same way (`own_folder`): made under
`folders/` of the records' folder with a record beside it, removed by `drop_folder`, and by
`reap_folders` once its owner is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import psutil

STATE_ENV = "HANDOFF_STATE_DIR"
#: Set on every process handoff starts, and so inherited by everything those start in turn:
#: what a run left behind is found by it even in a session of its own, re-parented to init.
MARK_ENV = "HANDOFF_STARTED_BY"


def mark() -> str:
    """The value of `MARK_ENV` for what this process starts: the one it was given itself (a run
    that a test started carries the test's), else its own pid."""
    return os.environ.get(MARK_ENV) or str(os.getpid())


def records_path() -> Path:
    """HANDOFF_STATE_DIR, else handoff-processes in the temporary folder; `records_dir` makes
    it."""
    return Path(os.environ.get(STATE_ENV) or Path(tempfile.gettempdir(), "handoff-processes"))


def records_dir() -> Path:
    folder = records_path()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def record(pid: int, name: str) -> None:
    """Remember that this process (the owner) started `pid`, called `name`."""
    write_owned(records_dir() / f"{pid}.json", pid=pid, started=_started(pid), name=name)


def write_owned(path: Path, **entry: object) -> None:
    """Write `entry` to `path` with this process as its owner (pid and start time)."""
    me = os.getpid()
    path.write_text(json.dumps({**entry, "owner": me, "owner_started": _started(me)}))


def orphaned(path: Path) -> dict | None:
    """The entry at `path` when the run that owns it no longer exists; None while it lives (or
    the file is being written by it right now)."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return None if _same(entry["owner"], entry["owner_started"]) else entry


def forget(pid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        (records_dir() / f"{pid}.json").unlink()


def _same(pid: int, started: float | None) -> bool:
    """Is `pid` still the process that was recorded (not a new one reusing the pid)?"""
    now = _started(pid)
    return now is not None and started is not None and abs(now - started) < 0.01


def _folders() -> Path:
    folder = records_dir() / "folders"
    folder.mkdir(exist_ok=True)
    return folder


def own_folder(name: str) -> Path:
    """A new, empty folder owned by this process, `name` made unique by its pid."""
    folder = _folders() / f"{name}-{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)
    write_owned(folder.with_name(folder.name + ".json"), folder=str(folder))
    folder.mkdir()
    return folder


def drop_folder(folder: Path) -> bool:
    """Remove `folder`, then its record; False, the record kept, when the folder stays."""
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        return False
    folder.with_name(folder.name + ".json").unlink(missing_ok=True)
    return True


def reap_folders() -> list[str]:
    """Remove the data folders of runs that no longer exist (once their processes are gone)."""
    reaped = []
    for path in sorted(_folders().glob("*.json")):
        if (entry := orphaned(path)) is not None:
            gone = drop_folder(Path(entry["folder"]))
            what = "" if gone else ", which stays: it could not be removed"
            reaped.append(f"data folder {entry['folder']} (owner pid {entry['owner']}{what})")
    return reaped


def reap_orphans() -> list[str]:
    """Kill what runs that no longer exist left running; one description per process."""
    reaped = []
    for path in sorted(records_dir().glob("*.json")):
        entry = orphaned(path)
        if entry is None:
            continue
        leader = _same(entry["pid"], entry["started"])
        if leader or not psutil.pid_exists(entry["pid"]):
            try:
                os.killpg(entry["pid"], signal.SIGKILL)  # its own session and group
            except (ProcessLookupError, PermissionError):
                killed = False  # no member left (or not ours)
            else:
                killed = True
            if leader:
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(entry["pid"]).kill()
            if leader or killed:
                what = "" if leader else ", the group its children kept"
                reaped.append(
                    f"{entry['name']} (pid {entry['pid']}{what}, owner pid {entry['owner']})"
                )
        path.unlink(missing_ok=True)
    return reaped
