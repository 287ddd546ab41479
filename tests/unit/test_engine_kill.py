"""The engine_failure fault on a stand-in worker: a parent process with a child titled as an
engine core. Only the child is signalled; the parent must then exit by itself, as Dynamo's
worker does when its engine dies, or the fault fails the case."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from handoff import faults
from handoff.backend import Worker
from handoff.errors import CaseFailure
from handoff.machine.polling import Deadline, poll_until
from handoff.machine.processes import ManagedProcess

TITLE = "TEST::EngineCore"
#: A worker whose engine core is a child titled TITLE; with "follows", it exits once the child
#: is gone, as Dynamo 1.6.1's worker does.
WORKER = """
import os, signal, subprocess, sys, time
child = subprocess.Popen(["bash", "-c", "exec -a {title} sleep 300"])
print(child.pid, flush=True)
while child.poll() is None or sys.argv[1] == "stays":
    time.sleep(0.05)
if sys.argv[1] == "crashes":
    os.kill(os.getpid(), signal.SIGABRT)
"""


#: A request in its window throughout (`faults.Watched`).
IN_WINDOW = SimpleNamespace(finished=False, outside=lambda when: None)


def titled(held: Worker) -> bool:
    try:
        faults.engine_core(held)
    except CaseFailure:
        return False
    return True


@pytest.fixture
def stand_in(tmp_path):
    """Starts stand-in workers; whatever is left of them is killed at the end."""
    started: list[ManagedProcess] = []

    def start(after_engine: str) -> Worker:
        """`after_engine`: "follows" (exits), "stays" or "crashes" (SIGABRT)."""
        argv = [sys.executable, "-c", WORKER.format(title=TITLE), after_engine]
        process = ManagedProcess("worker-1-aggregate", argv, {}, tmp_path / "worker.log")
        started.append(process)
        process.start()
        held = Worker("worker-1-aggregate", "aggregate", process, {"system": 0}, TITLE)
        poll_until(
            lambda: (True, None) if titled(held) else (None, process.tree()),
            Deadline(10),
            "the stand-in worker's engine core to take its title",
        )
        return held

    yield start
    for process in started:
        process.kill()
        assert process.wait_gone(Deadline(10)) == []


def test_only_the_engine_core_is_killed_and_the_worker_must_follow(stand_in):
    held = stand_in("follows")
    engine = faults.engine_core(held)
    report = faults.kill_engine("engine_failure", held, IN_WINDOW, Deadline(30))
    assert (report.fault, report.pid, report.signals) == (
        "engine_failure",
        engine.pid,
        ("SIGKILL",),
    )
    assert held.process.exit_code() == 0  # it exited by itself: it was never signalled
    assert report.engine_killed_at is not None


def test_a_worker_that_crashes_after_its_engine_fails_the_case(stand_in):
    held = stand_in("crashes")
    with pytest.raises(CaseFailure, match="ended by signal 6 after its engine core was killed"):
        faults.kill_engine("engine_failure", held, IN_WINDOW, Deadline(30))


def test_a_worker_that_outlives_its_engine_fails_the_case(stand_in, monkeypatch):
    monkeypatch.setattr(faults, "ENGINE_EXIT_S", 1.0)
    held = stand_in("stays")
    with pytest.raises(CaseFailure, match="still running 1 s after its engine core"):
        faults.kill_engine("engine_failure", held, IN_WINDOW, Deadline(30))
    assert held.process.exit_code() is None  # alive, and never signalled


def test_a_worker_without_an_engine_core_apart_is_refused(stand_in):
    held = stand_in("follows")
    other = Worker(held.name, held.role, held.process, held.ports, "Other::Core")
    with pytest.raises(CaseFailure, match="holds 0 processes titled 'Other::Core'"):
        faults.engine_core(other)
