"""Managed processes: a whole tree goes down, and a missing binary is a clear error."""

import psutil
import pytest

from handoff.errors import HandoffError
from handoff.polling import Deadline, poll_until
from handoff.processes import ManagedProcess


def test_kill_takes_down_the_whole_tree(tmp_path):
    process = ManagedProcess(
        "tree",
        ["bash", "-c", "sleep 300 & sleep 300 & wait"],
        {"PATH": "/usr/bin:/bin"},
        tmp_path / "tree.log",
    )
    process.start()
    poll_until(
        lambda: (True, None) if len(process.tree()) == 3 else (None, process.tree()),
        Deadline(10),
        "bash and its two sleeps",
    )
    pids = [p.pid for p in process.tree()]
    process.kill()
    assert process.wait_gone(Deadline(10)) == []
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids
    )
    assert process.exit_code() == -9


def test_missing_binary_is_named(tmp_path):
    process = ManagedProcess("ghost", ["no-such-binary-here"], {}, tmp_path / "ghost.log")
    with pytest.raises(HandoffError, match="no-such-binary-here not found"):
        process.start()
