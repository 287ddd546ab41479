"""The machine-wide VRAM ledger: real flock, processes competing for one GPU's budget, which
is never exceeded; a dead holder's reservation no longer counts; NVML's live use respected."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fake_nvml import FakeNvml

from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.sharing.placement import Demand
from handoff.sharing.vram_ledger import GpuLedger, process_trees, start_time

HERE = Path(__file__).parent
#: A competitor: says it is asking, takes its GiB from the ledger (budget 10 of a 24 GiB GPU),
#: records what the ledger held then, holds until the test creates its release file (as a case
#: runs until it ends), then releases. The test, not the clock, decides who holds together.
COMPETITOR = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from fake_nvml import FakeNvml
from handoff.sharing.vram_ledger import GpuLedger
from handoff.sharing.placement import Demand
from handoff.machine.polling import Deadline, poll_until
folder, gib, log = Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
ledger = GpuLedger(FakeNvml(24), budget_gib=10, folder=folder)
log.with_suffix(".asking").touch()
taken = ledger.take(Demand(log.stem, gib), Deadline(60))
seen = sum(r.gib for r in ledger.held())
log.with_suffix(".held").write_text(json.dumps({"gib": gib, "seen": seen}))
release = log.with_suffix(".release")
poll_until(lambda: (True if release.exists() else None, "no release"), Deadline(60), "release")
ledger.release(taken)
"""


def ledger_of(nvml, tmp_path, budget=None):
    return GpuLedger(nvml, budget_gib=budget, folder=tmp_path / "leases")


def test_competing_processes_share_the_budget_and_never_exceed_it(tmp_path):
    """6 and 4 GiB hold together (10 of 10); a third asking 3 waits until one of them ends;
    the ledger, as every process sees it, never holds more than 10."""
    folder = tmp_path / "leases"
    watcher = GpuLedger(FakeNvml(24), budget_gib=10, folder=folder)
    running = {}

    def start(name, gib):
        log = tmp_path / f"{name}.json"
        argv = [sys.executable, "-c", COMPETITOR, str(HERE), str(folder), str(gib), str(log)]
        running[name] = (subprocess.Popen(argv), log)

    def held_becomes(keys):
        def probe():
            now = sorted(r.key for r in watcher.held())
            assert sum(r.gib for r in watcher.held()) <= 10
            return (True if now == sorted(keys) else None), now

        poll_until(probe, Deadline(60), f"the ledger to hold {sorted(keys)}")

    try:
        start("six", 6)
        start("four", 4)
        held_becomes(["six", "four"])  # they share the GPU: 10 of 10
        start("three", 3)
        asking = running["three"][1].with_suffix(".asking")
        poll_until(lambda: (asking.exists() or None, "not yet"), Deadline(60), "three to ask")
        held_becomes(["six", "four"])
        assert not running["three"][1].with_suffix(".held").exists()
        running["six"][1].with_suffix(".release").touch()
        held_becomes(["four", "three"])
        seen_by_three = running["three"][1].with_suffix(".held")  # what it saw, before any goes
        poll_until(lambda: (seen_by_three.exists() or None, "not yet"), Deadline(60), "three")
        for _, log in running.values():
            log.with_suffix(".release").touch()
        held_becomes([])
        assert [p.wait(60) for p, _ in running.values()] == [0, 0, 0]
    finally:
        for process, _ in running.values():
            process.kill()
    seen = {n: json.loads(log.with_suffix(".held").read_text()) for n, (_, log) in running.items()}
    assert all(record["seen"] <= 10 for record in seen.values())
    assert seen["three"]["seen"] == 7  # four and itself


def test_a_killed_holder_no_longer_counts(tmp_path):
    folder = tmp_path / "leases"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from pathlib import Path\n"
         f"sys.path.insert(0, {str(HERE)!r})\n"
         "from fake_nvml import FakeNvml\n"
         "from handoff.sharing.vram_ledger import GpuLedger\n"
         "from handoff.sharing.placement import Demand\n"
         "from handoff.machine.polling import Deadline\n"
         f"GpuLedger(FakeNvml(24), 10, Path({str(folder)!r}))"
         ".take(Demand('held', 10), Deadline(10))\n"
         "print('taken', flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "taken"
        ledger = GpuLedger(FakeNvml(24), budget_gib=10, folder=folder)
        assert [r.key for r in ledger.held()] == ["held"]
        assert ledger.try_take(Demand("next", 1))[0] is None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # SIGKILL: no teardown ran, no release; the entry's holder is gone, so it is ignored.
    taken, _ = ledger.try_take(Demand("next", 10))
    assert taken is not None and [r.key for r in ledger.held()] == ["next"]


def test_memory_another_tenant_uses_is_respected(tmp_path):
    nvml = FakeNvml(24)
    nvml.use(0, 1, 20)  # pid 1 exists here and is not a holder's
    ledger = ledger_of(nvml, tmp_path)
    (room,) = ledger.rooms()
    assert room.foreign_gib == pytest.approx(20.6) and room.free_gib == pytest.approx(3.4)
    assert ledger.try_take(Demand("a", 4))[0] is None
    assert ledger.try_take(Demand("b", 3))[0].gpu == 0


def test_what_the_holders_processes_use_is_theirs_up_to_what_they_reserved(tmp_path):
    nvml = FakeNvml(24)
    ledger = ledger_of(nvml, tmp_path)
    ledger.try_take(Demand("mine", 8))
    nvml.use(0, os.getpid(), 6)  # still growing towards its marker
    (room,) = ledger.rooms()
    assert (room.reserved_gib, room.foreign_gib) == (8, pytest.approx(0.6))
    assert room.free_gib == pytest.approx(24 - 0.6 - 8)
    nvml.use(0, os.getpid(), 12)  # past its marker: the excess counts as someone else's
    (room,) = ledger.rooms()
    assert room.foreign_gib == pytest.approx(0.6 + 4)


def test_without_per_process_use_others_are_what_the_reservations_do_not_explain(tmp_path):
    nvml = FakeNvml(24)
    ledger = ledger_of(nvml, tmp_path)
    ledger.try_take(Demand("mine", 8))
    nvml.use(0, 99_999_999, 8)  # a host pid seen from a container: not a process here
    (room,) = ledger.rooms()
    assert room.foreign_gib == pytest.approx(0.6)
    nvml.per_process = False
    nvml.use(0, 99_999_999, 18)
    (room,) = ledger.rooms()
    assert room.foreign_gib == pytest.approx(18.6 - 8)


def test_best_fit_across_gpus_and_release(tmp_path):
    ledger = ledger_of(FakeNvml(48, 24), tmp_path, budget=40)
    first, _ = ledger.try_take(Demand("a", 20))
    assert first.gpu == 1  # the tighter GPU that fits
    second, _ = ledger.try_take(Demand("b", 20))
    assert second.gpu == 0  # GPU 1 has 3.4 GiB left
    ledger.release(first)
    assert [r.key for r in ledger.held()] == ["b"]


def test_a_case_that_never_fits_times_out_saying_what_holds_the_memory(tmp_path):
    ledger = ledger_of(FakeNvml(24), tmp_path, budget=10)
    ledger.try_take(Demand("holder", 8))
    with pytest.raises(Timeout) as caught:
        ledger.take(Demand("waiter", 4), Deadline(0.3))
    assert str(caught.value) == (
        "timed out waiting for 4 GiB of GPU memory for waiter; last seen: GPU 0: 8.0 GiB held "
        "by 1 case(s), 0.6 GiB used by other processes, 2.0 GiB free within a 10.0 GiB budget"
    )


def test_process_helpers_read_proc():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in process_trees({os.getpid()})
        assert start_time(child.pid) is not None and start_time(99_999_999) is None
    finally:
        child.kill()
        child.wait()


def test_a_reservation_whose_processes_stop_first_makes_room_for_its_successor_alone(tmp_path):
    """A process's next pool reserves while its last pool's workers still run (they stop
    before its own start): their room counts as free for it, and for no one else; both stay
    in the ledger until the last is released."""
    ledger = ledger_of(FakeNvml(24), tmp_path, budget=10)
    last, _ = ledger.try_take(Demand("last pool", 8))
    assert ledger.try_take(Demand("next pool", 6))[0] is None
    successor, _ = ledger.try_take(Demand("next pool", 6), yielding=last)
    assert successor.gpu == last.gpu
    assert sorted(r.key for r in ledger.held()) == ["last pool", "next pool"]
    assert ledger.try_take(Demand("another", 1), yielding=None)[0] is None  # still full
    ledger.release(last)
    assert ledger.try_take(Demand("another", 4))[0] is not None
