"""Managed processes: a whole tree goes down, and a missing binary is a clear error."""

import signal
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from handoff import faults
from handoff.errors import HandoffError
from handoff.machine.polling import Deadline, poll_until
from handoff.machine.processes import ManagedProcess


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


#: A parent that starts a child, prints the child's pid, and sleeps: as dynamo.vllm starts
#: its VLLM::EngineCore.
PARENT = [
    "python3", "-c",
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(300)\n",
]  # fmt: skip


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def child_pid(process: ManagedProcess) -> int:
    def printed():
        text = process.log_path.read_text() if process.log_path.exists() else ""
        return (int(text.split()[0]) if text.strip() else None), text

    return poll_until(printed, Deadline(10), "the parent to print its child's pid")


def test_a_child_orphaned_before_it_was_seen_is_still_killed(tmp_path):
    """The parent is SIGKILLed (by a fault, or a crash) before handoff ever listed its tree: the
    child, re-parented to init, is found by the process group it kept."""
    process = ManagedProcess("parent", PARENT, {"PATH": "/usr/bin:/bin"}, tmp_path / "p.log")
    process.start()
    orphan = child_pid(process)
    psutil.Process(process.pid).kill()  # the parent alone, as a crash would
    process.popen.wait()
    assert alive(orphan) and psutil.Process(orphan).ppid() != process.pid
    process.kill()
    assert process.wait_gone(Deadline(10)) == []
    assert not alive(orphan)


def test_a_niceness_reaches_the_process_and_its_children(tmp_path):
    """A worker that yields the CPU does so from its first instruction, and so does every
    child it starts (vLLM's EngineCore)."""
    base = psutil.Process().nice()
    process = ManagedProcess(
        "yielding",
        ["bash", "-c", "sleep 300 & wait"],
        {"PATH": "/usr/bin:/bin"},
        tmp_path / "yielding.log",
        niceness=7,
    )
    process.start()
    try:
        tree = poll_until(
            lambda: (process.tree(), None) if len(process.tree()) == 2 else (None, process.tree()),
            Deadline(10),
            "bash and its sleep",
        )
        expected = min(base + 7, 19)  # the kernel's ceiling, for a test run under nice
        assert [p.nice() for p in tree] == [expected, expected]
    finally:
        process.kill()
        process.wait_gone(Deadline(10))


BUSY_THREADS = """
import threading
def spin():
    while True:
        pass
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
print("spinning", flush=True)
spin()
"""


def test_freeze_returns_once_every_thread_of_the_tree_is_stopped(tmp_path):
    """Five threads that never leave the CPU, in a child of the managed process: when freeze
    returns, each of them is stopped."""
    process = ManagedProcess(
        "spinners",
        ["bash", "-c", f"{sys.executable} -c '{BUSY_THREADS}' & wait"],
        {"PATH": "/usr/bin:/bin"},
        tmp_path / "spinners.log",
    )
    process.start()
    try:

        def spinning():
            return ("spinning" in process.log_tail()) or None, process.log_tail()

        poll_until(spinning, Deadline(20), "the child's threads to spin")
        process.freeze(Deadline(10))
        (child,) = [p for p in process.tree() if p.pid != process.pid]
        threads = child.threads()
        assert len(threads) == 5
        assert {psutil.Process(t.id).status() for t in threads} == {psutil.STATUS_STOPPED}
    finally:
        process.kill()
        assert process.wait_gone(Deadline(10)) == []


def test_an_exit_is_within_a_bound_only_when_seen_before_it(tmp_path):
    """A drain's bound is the state at the bound: an exit seen in time counts; a process still
    running at the bound does not, nor does one whose exit is first seen once the bound passed
    (a poll woken late), though it has exited by then."""
    quick = ManagedProcess("quick", ["true"], {"PATH": "/usr/bin:/bin"}, tmp_path / "q.log")
    quick.start()
    assert quick.exited_within(Deadline(10))
    slow = ManagedProcess("slow", ["sleep", "300"], {"PATH": "/usr/bin:/bin"}, tmp_path / "s.log")
    slow.start()
    assert not slow.exited_within(Deadline(0.2))
    slow.kill()
    assert slow.wait_gone(Deadline(10)) == []
    assert not slow.exited_within(Deadline(0))  # exited, but seen only past the bound


def test_a_drain_signal_reaches_the_leader_alone_with_no_look_at_proc(tmp_path, monkeypatch):
    """A drain's SIGTERM goes out before any listing of the machine's processes, which takes
    seconds on a busy one (the request it aims at could end meanwhile); its child is not
    signalled."""
    process = ManagedProcess("parent", PARENT, {"PATH": "/usr/bin:/bin"}, tmp_path / "p.log")
    process.start()
    child = child_pid(process)

    def listing(*_args, **_kwargs):
        raise AssertionError("the processes were listed before the signal")

    monkeypatch.setattr(psutil.Process, "children", listing)
    monkeypatch.setattr(psutil, "process_iter", listing)
    process.signal_leader(signal.SIGTERM)
    assert process.popen.wait(timeout=10) == -signal.SIGTERM
    assert alive(child)
    monkeypatch.undo()
    process.kill()
    assert process.wait_gone(Deadline(10)) == []


def test_a_drains_bound_counts_from_its_sigterm_not_from_a_slow_listing(tmp_path, monkeypatch):
    """The listing after the SIGTERM took seconds on a busy machine (measured: a rolling drain's
    SIGKILL came 3.5 s past its 2 s bound, after its requests had ended): the bound the exit is
    awaited within counts from the signal, so a listing longer than the bound leaves none."""
    process = ManagedProcess("parent", PARENT, {"PATH": "/usr/bin:/bin"}, tmp_path / "p.log")
    process.start()
    holder = SimpleNamespace(name="parent", process=process)
    tree, exited_within, left = process.tree, process.exited_within, []

    def slow_tree():
        if not left:  # the first listing, right after the SIGTERM: longer than the bound
            time.sleep(0.6)  # stands for a machine slow to list, not a synchronisation
        return tree()

    def awaited(bound):
        left.append(bound.remaining())
        return exited_within(bound)

    monkeypatch.setattr(process, "tree", slow_tree)
    monkeypatch.setattr(process, "exited_within", awaited)
    monkeypatch.setattr(process, "signal_leader", lambda sig: True)  # it drains on, unsignalled
    watched = SimpleNamespace(finished=False)
    report = faults.drain("graceful_shutdown", holder, watched, 0.5, False, Deadline(30))
    assert report.signals == ("SIGTERM", "SIGKILL")
    assert left and left[0] <= 0, left  # the bound had passed during the listing
    assert process.wait_gone(Deadline(10)) == []
