"""The start gate: no more starts at once than slots, a slot freed however its holder ends."""

import subprocess
import sys

import pytest

from handoff.machine import start_gate
from handoff.machine.cpus import SLOTS_ENV
from handoff.machine.polling import Deadline, Timeout
from handoff.machine.ports import LEASE_DIR_ENV

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDONLY, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path))
    return tmp_path


def test_a_start_past_the_slots_waits_and_says_what_it_awaited(folder):
    first, second, third = (start_gate.start_slot(Deadline(s), count=2) for s in (5, 5, 0.2))
    with first, second, pytest.raises(Timeout, match=r"a start slot .* all 2 start slot"), third:
        pass
    with start_gate.start_slot(Deadline(0.2), count=2) as waited:
        assert waited < 0.2


def test_a_slot_held_by_a_process_that_died_is_free_again(folder):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder / "start-0.slot")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with (
            pytest.raises(Timeout, match="all 1 start slot"),
            start_gate.start_slot(Deadline(0.2), count=1),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    with start_gate.start_slot(Deadline(0.2), count=1):
        pass


def test_slots_follow_the_cpus_and_a_chosen_case_count_leaves_starts_ungated(monkeypatch):
    monkeypatch.delenv(SLOTS_ENV, raising=False)
    assert start_gate.slots() >= 1
    monkeypatch.setenv(SLOTS_ENV, "8")
    assert start_gate.slots() == 0
    with start_gate.start_slot(Deadline(0)) as waited:
        assert waited == 0.0
