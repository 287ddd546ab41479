"""A run killed before its teardown leaves processes behind; the next run reaps exactly those:
recorded by pid and start time, owner gone. Never by name, never another live run's."""

import json
import subprocess
import sys

import psutil
import pytest

from handoff.machine import ownership
from handoff.machine.polling import Deadline, poll_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv(ownership.STATE_ENV, str(tmp_path))
    return tmp_path


def gone(pid):
    poll_until(
        lambda: (True, None) if not psutil.pid_exists(pid) or
        psutil.Process(pid).status() == psutil.STATUS_ZOMBIE else (None, "alive"),
        Deadline(10), f"pid {pid} to exit",
    )  # fmt: skip
    return True


def test_processes_of_a_killed_run_are_reaped(state):
    # The owner starts a sleeper in its own session, records it, and is SIGKILLed: no teardown.
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "from handoff.machine import ownership\n"
         f"p = subprocess.Popen({SLEEPER!r}, start_new_session=True)\n"
         "ownership.record(p.pid, 'worker-0-aggregate')\n"
         "print(p.pid, flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    orphan = int(owner.stdout.readline())
    assert ownership.reap_orphans() == []  # its owner is alive: another run's, left alone
    assert psutil.pid_exists(orphan)
    owner.kill()
    owner.wait()
    reaped = ownership.reap_orphans()
    assert reaped == [f"worker-0-aggregate (pid {orphan}, owner pid {owner.pid})"]
    assert gone(orphan)
    assert list(state.glob("*.json")) == []


def test_a_reused_pid_is_never_killed(state):
    stranger = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        # A record of the same pid from a dead owner, but another start time: not the same process.
        (state / f"{stranger.pid}.json").write_text(json.dumps({
            "pid": stranger.pid, "started": 1.0, "name": "worker", "owner": 1,
            "owner_started": 2.0,
        }))  # fmt: skip
        assert ownership.reap_orphans() == []
        assert stranger.poll() is None
        assert list(state.glob("*.json")) == []  # the stale record is dropped
    finally:
        stranger.kill()
        stranger.wait()


def test_a_process_that_exits_cleanly_leaves_no_record(state, tmp_path):
    from handoff.machine.processes import ManagedProcess

    process = ManagedProcess("sleeper", SLEEPER, {}, tmp_path / "sleeper.log")
    process.start()
    assert json.loads((state / f"{process.pid}.json").read_text())["name"] == "sleeper"
    process.kill()
    assert process.wait_gone(Deadline(10)) == []
    assert list(state.glob("*.json")) == []


def test_the_group_a_dead_worker_left_is_reaped(state):
    """A killed run's worker died too, but its child lives on in the worker's process group
    (as a SIGKILLed dynamo.vllm leaves its EngineCore): the next run reaps the group."""
    worker = (
        "import subprocess, sys, time\n"
        f"c = subprocess.Popen({SLEEPER!r})\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "from handoff.machine import ownership\n"
         f"parent = subprocess.Popen([sys.executable, '-c', {worker!r}], "
         "start_new_session=True, stdout=subprocess.PIPE, text=True)\n"
         "ownership.record(parent.pid, 'worker-0-aggregate')\n"
         "print(parent.pid, parent.stdout.readline().strip(), flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    parent, child = map(int, owner.stdout.readline().split())
    owner.kill()
    owner.wait()
    psutil.Process(parent).kill()  # the worker dies; its child is re-parented, group kept
    assert gone(parent) and psutil.Process(child).is_running()
    (reaped,) = ownership.reap_orphans()  # the worker may linger as a zombie: either way
    assert reaped.startswith(f"worker-0-aggregate (pid {parent}")
    assert gone(child)
