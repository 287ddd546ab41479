"""When a faulted worker is back once the frontend has moved its request: once the successor has
streamed, the response has ended, or the lease-bound deadline has come, and never twice; in a
race case, a stalled worker at the move, a cut-off one only at the end."""

import signal
import time
from types import SimpleNamespace

import pytest

from handoff import lifecycle
from handoff.faults import FaultReport
from handoff.history import History
from handoff.responses.recovery import MOVE_SETTLE_S, RESUME_BY_S, Heal


class Holder:
    """A worker whose tree records the signals it gets."""

    def __init__(self) -> None:
        self.name = "worker-1-decode"
        self.signals: list[int] = []
        self.process = SimpleNamespace(signal_tree=self.signals.append)


class Cut:
    def __init__(self) -> None:
        self.healed = 0

    def heal(self) -> None:
        self.healed += 1

    def dropped(self) -> int:
        return 7


def report(fault: str, cut: Cut | None = None) -> FaultReport:
    return FaultReport(fault, "worker-1-decode", 1, ("SIGSTOP",), False, cut=cut)


def response(chunks: int, finished: bool = False, stream: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        response=SimpleNamespace(content_chunks=chunks),
        finished=finished,
        request=SimpleNamespace(stream=stream),
    )


def resumes(history: History) -> list[dict]:
    return [e.data for e in history.events if e.name == "worker_resumed"]


def test_a_stalled_worker_stays_stopped_until_the_successor_streams_then_resumes_once():
    holder, history = Holder(), History()
    heal = Heal(holder, report("worker_stall"), history, lifecycle.of("worker_stall"))
    heal.after_move([response(12)])  # the move counted; nothing from the successor yet
    heal.after_move([response(12)])
    assert holder.signals == [] and not heal.done
    heal.after_move([response(13)])
    heal.after_move([response(14)])
    heal()
    assert holder.signals == [signal.SIGCONT]
    assert len(resumes(history)) == 1


def test_a_stalled_worker_resumes_when_the_response_ends_without_a_successor():
    holder = Holder()
    heal = Heal(holder, report("worker_stall"), History(), lifecycle.of("worker_stall"))
    heal.after_move([response(12)])
    heal.after_move([response(12, finished=True)])
    assert holder.signals == [signal.SIGCONT]


def test_a_stalled_worker_resumes_by_the_lease_bound_deadline_whatever_the_successor_does():
    holder = Holder()
    heal = Heal(holder, report("worker_stall"), History(), lifecycle.of("worker_stall"))
    assert heal.resume_by - time.monotonic() == pytest.approx(RESUME_BY_S, abs=0.5)
    heal.after_move([response(12)])
    heal.resume_by = heal.moved_at = time.monotonic() - MOVE_SETTLE_S - 0.01
    heal.after_move([response(12)])
    assert holder.signals == [signal.SIGCONT]


def test_a_move_counted_past_the_lease_bound_deadline_still_waits_its_settling_time():
    """Run again within milliseconds of the move, the worker can miss the cancellation
    (Dynamo 13088): a late move does not bring it back at once."""
    holder = Holder()
    heal = Heal(holder, report("worker_stall"), History(), lifecycle.of("worker_stall"))
    heal.resume_by = time.monotonic() - 0.01  # the move comes after the deadline
    heal.after_move([response(12)])
    heal.after_move([response(12)])
    assert holder.signals == []
    heal.moved_at -= MOVE_SETTLE_S
    heal.after_move([response(12)])
    assert holder.signals == [signal.SIGCONT]


def test_a_worker_that_held_several_requests_waits_for_each_successor():
    """Under load: each moved stream must have streamed from its successor, and a moved unary
    request must have ended, before the worker runs again."""
    holder = Holder()
    heal = Heal(holder, report("worker_stall"), History(), lifecycle.of("worker_stall"))
    heal.after_move([response(5), response(0, stream=False), response(9)])
    heal.after_move([response(6), response(0, stream=False), response(9)])
    heal.after_move([response(6), response(0, stream=False), response(10)])
    assert holder.signals == []
    heal.after_move([response(7), response(0, finished=True, stream=False), response(11)])
    assert holder.signals == [signal.SIGCONT]


def test_a_partition_heals_as_soon_as_the_move_is_counted():
    holder, cut, history = Holder(), Cut(), History()
    heal = Heal(holder, report("partition", cut), history, lifecycle.of("partition"))
    heal.after_move([response(12)])
    heal.after_move([response(13)])
    assert cut.healed == 1 and holder.signals == []
    assert resumes(history)[0]["packets_dropped"] == 7


def test_a_race_resumes_a_stalled_worker_the_instant_the_move_is_counted():
    holder = Holder()
    heal = Heal(
        holder, report("worker_stall"), History(), lifecycle.of("worker_stall"), race=lambda: 0
    )
    heal.after_move([response(12)])
    assert holder.signals == [signal.SIGCONT]


def test_a_race_keeps_a_cut_off_worker_cut_off_until_the_responses_end():
    """Healed, it would hear the cancellation and drop the request it lost: no race left."""
    holder, cut = Holder(), Cut()
    heal = Heal(
        holder, report("partition", cut), History(), lifecycle.of("partition"), race=lambda: 0
    )
    heal.after_move([response(12)])
    heal.resume_by = heal.moved_at = time.monotonic() - MOVE_SETTLE_S - 0.01
    heal.after_move([response(13)])
    heal.after_move([response(14, finished=True)])
    assert cut.healed == 0
    heal()
    assert cut.healed == 1


def test_a_race_records_the_lost_request_running_once_its_engine_shows_it():
    """The race's witness (`policies.LOST_RAN_ON`): after the move the stalled worker's engine
    is read until it reports a request running, once."""
    holder, history, readings = Holder(), History(), iter([None, 0, 1, 1])
    heal = Heal(
        holder,
        report("worker_stall"),
        history,
        lifecycle.of("worker_stall"),
        race=lambda: next(readings),
    )
    for chunks in (12, 12, 12, 12):
        heal.after_move([response(chunks)])
    running = [e.data for e in history.events if e.name == "lost_request_running"]
    assert running == [{"worker": holder.name, "running": 1}]
