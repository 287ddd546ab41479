"""The wall-clock watch, on a clock this test steps (the machine's clock is left alone), and
what a step does to a case's verdict. No step is too small to count: only what a reading
cannot tell, measured by the reading itself, is not one."""

import time
from types import SimpleNamespace

import pytest

from handoff.history import History
from handoff.machine import wallclock
from handoff.runner import clock_stepped
from handoff.verdict import Verdict


@pytest.fixture
def clock(monkeypatch):
    """Both clocks on one counter this test drives, so no preemption of the test's own process
    widens a reading: each read of either clock takes 1 us; the wall clock reads `ahead`
    seconds off; `preempted` nanoseconds pass between the wall clock's read and the monotonic
    read after it (a process that lost its core there)."""
    state = SimpleNamespace(ahead=0.0, preempted=0, reads=0, now=time.monotonic_ns())

    def monotonic_ns():
        state.reads += 1
        state.now += 1_000 + (state.preempted if state.reads % 2 == 0 else 0)
        return state.now

    def time_ns():
        state.now += 1_000
        return state.now + round(state.ahead * 1e9)

    fake = SimpleNamespace(
        time_ns=time_ns, monotonic_ns=monotonic_ns, get_clock_info=time.get_clock_info
    )
    monkeypatch.setattr(wallclock, "time", fake)
    return state


def test_a_clock_that_holds_has_not_stepped(clock):
    watch = wallclock.WallClock()
    for _ in range(1000):
        assert watch.stepped() is None


@pytest.mark.parametrize(
    ("step", "said"), [(24.1, "+24.1 s"), (-5.0, "-5.0 s"), (0.002, "+2 ms"), (-5e-5, "-0.05 ms")]
)
def test_a_step_either_way_is_read_once_and_the_watch_begins_again(clock, step, said):
    """No limit to pass: a step of 50 us, far below any lease, is a step (it moves log lines
    stamped to the microsecond). The step read is the true one within what the two readings
    could not tell (half of each bracket), and said to the unit it is in."""
    watch = wallclock.WallClock()
    start = watch.offset
    clock.ahead = step
    seen = watch.stepped()
    end = watch.offset
    untold_ns = (start.high - start.low + end.high - end.low) / 2 + wallclock.resolution_ns()
    assert seen is not None and abs(seen - step) <= untold_ns / 1e9 + 1e-6  # + rounding
    assert wallclock.step_reason(step).startswith(f"the machine's wall clock stepped {said} ")
    assert watch.stepped() is None


def test_a_move_within_what_a_reading_cannot_tell_is_not_a_step(clock):
    """A reading preempted for 5 ms between its reads brackets the offset 5 ms wide: a 1 ms
    move inside that cannot be told from none, and a 20 ms one outside it still can (read
    against that wide bracket: 19 ms between the two middles)."""
    watch = wallclock.WallClock()
    clock.preempted, clock.ahead = 5_000_000, 0.001
    assert watch.stepped() is None
    clock.ahead = 0.02
    assert watch.stepped() == pytest.approx(0.019, abs=0.001)


def test_what_readings_can_tell_is_measured_not_set():
    same = wallclock.Offset(100, 300)
    assert wallclock.step_between(same, wallclock.Offset(250, 260), resolution=2) is None
    assert wallclock.step_between(same, wallclock.Offset(310, 320), resolution=2) == 1.15e-7
    assert wallclock.step_between(same, wallclock.Offset(310, 320), resolution=20) is None


def test_a_pass_that_saw_a_step_stays_a_pass_and_notes_it():
    history = History()
    verdict = clock_stepped(Verdict(True, notes=["kept"]), 24.1, history)
    assert verdict.passed and verdict.reasons == []
    assert verdict.notes[0] == "kept" and verdict.notes[1].startswith(
        "the machine's wall clock stepped +24.1 s"
    )
    assert history.events[-1].name == "wall_clock_stepped"
    assert history.events[-1].data == {"seconds": 24.1}


def test_a_failure_that_saw_a_step_leads_with_it_and_no_known_defect_excuses_it():
    failed = Verdict(False, ["never routed to again"], "verdict", upstream_defect="Dynamo 1")
    verdict = clock_stepped(failed, -5.0, History())
    assert not verdict.passed and verdict.upstream_defect == ""
    assert verdict.phase == "verdict"
    assert verdict.reasons[0].startswith("the machine's wall clock stepped -5.0 s")
    assert verdict.reasons[1:] == ["never routed to again"]
