"""Ctrl-C, SIGTERM and SIGKILL to a pytest run in the middle of a case: afterwards nothing that
handoff started is alive, every leased port is free, and the next run starts clean."""

import fcntl
import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from handoff.polling import Deadline, poll_until
from handoff.ports import bindable

CASE = "aggregate/migration_enabled-graceful_shutdown-completion-unary-tcp"


@pytest.fixture
def isolated(tmp_path):
    """Its own process records, port lease folder and log folder."""
    folders = {name: tmp_path / name for name in ("records", "leases", "runs")}
    env = {
        **os.environ,
        "HANDOFF_STATE_DIR": str(folders["records"]),
        "HANDOFF_PORT_LEASES": str(folders["leases"]),
    }
    env.pop("HANDOFF_RUN_DIR", None)
    return folders, env


def start_run(folders, env):
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification", "-p",
         "no:cacheprovider", "--handoff-backend", "mocker", "--handoff-logs",
         str(folders["runs"]), "-k", CASE.split("/")[1], "--handoff-topology", "aggregate"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def recorded(folders) -> dict[int, float]:
    out = {}
    for path in folders["records"].glob("*.json"):
        try:
            entry = json.loads(path.read_text())
        except ValueError:
            continue  # being written
        out[entry["pid"]] = entry["started"]
    return out


def wait_for_deployment(folders, run):
    """The frontend and both workers are up: the case is in its middle."""
    return poll_until(
        lambda: (seen, None) if len(seen := recorded(folders)) >= 3 else (None, seen),
        Deadline(60),
        "the run to record the frontend and two workers",
    )


def alive(pid, started):
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_clean(folders, started):
    assert not [p for p, t in started.items() if alive(p, t)], "processes left running"
    assert recorded(folders) == {}
    leases = list(folders["leases"].glob("*.lock"))
    assert leases, "the run leased no port"
    for lock in leases:
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody holds the lease
        finally:
            os.close(fd)
        assert bindable(int(lock.stem)), f"port {lock.stem} still bound"


def next_run_is_clean(folders, env):
    run = start_run(folders, env)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, out[-3000:]
    assert "left running by a run that no longer exists" not in out
    assert "1 passed" in out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_tears_its_case_down(isolated, sig):
    folders, env = isolated
    run = start_run(folders, env)
    started = wait_for_deployment(folders, run)
    run.send_signal(sig)
    out, _ = run.communicate(timeout=60)
    assert run.returncode != 0
    assert "KeyboardInterrupt" in out or "Interrupted" in out, out[-2000:]
    assert_clean(folders, started)
    next_run_is_clean(folders, env)


def test_a_killed_run_is_cleaned_up_by_the_next_one(isolated):
    folders, env = isolated
    run = start_run(folders, env)
    started = wait_for_deployment(folders, run)
    run.kill()  # no teardown at all: the deployment is orphaned
    run.communicate(timeout=30)
    assert all(alive(p, t) for p, t in started.items())
    after = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification", "-p",
         "no:cacheprovider", "--handoff-backend", "mocker", "--collect-only", "-q"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    killed = [line for line in after.stdout.splitlines() if line.startswith("handoff: killed ")]
    assert len(killed) == len(started), after.stdout[-2000:]
    poll_until(
        lambda: (True, None) if not [p for p, t in started.items() if alive(p, t)] else (None, 0),
        Deadline(10),
        "the reaped processes to exit",
    )
    assert_clean(folders, started)
    next_run_is_clean(folders, env)
