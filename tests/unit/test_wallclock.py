"""The wall-clock watch, on a clock this test steps (the machine's clock is left alone), and
what a step does to a case's verdict."""

import time
from types import SimpleNamespace

import pytest

from handoff.history import History
from handoff.machine import wallclock
from handoff.runner import clock_stepped
from handoff.verdict import Verdict


@pytest.fixture
def clock(monkeypatch):
    """A wall clock `ahead` seconds off the real one; the monotonic clock is the real one."""
    state = SimpleNamespace(ahead=0.0)
    fake = SimpleNamespace(time=lambda: time.time() + state.ahead, monotonic=time.monotonic)
    monkeypatch.setattr(wallclock, "time", fake)
    return state


def test_a_clock_that_holds_or_slews_has_not_stepped(clock):
    watch = wallclock.WallClock()
    assert watch.stepped() is None
    clock.ahead = wallclock.STEP_LIMIT_S * 0.9
    assert watch.stepped() is None


@pytest.mark.parametrize("step", [24.1, -5.0])
def test_a_step_either_way_is_read_once_and_the_watch_begins_again(clock, step):
    watch = wallclock.WallClock()
    clock.ahead = step
    assert watch.stepped() == step
    assert watch.stepped() is None


def test_steps_smaller_than_the_limit_are_not_summed_once_read(clock):
    watch = wallclock.WallClock()
    for ahead in (1.5, 3.0):
        clock.ahead = ahead
        assert watch.stepped() is None


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
