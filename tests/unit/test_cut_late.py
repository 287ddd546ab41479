"""Where a decode worker is cut off: in its response's last half stream timeout, so that the
request it lost has ended before the frontend moves it (Dynamo 1.6.1 holds the re-issued
prefill until then), except in the race case, which cuts early on purpose and is not proven
where the lost request could not outlast the HTTP layer's window."""

import time
from types import SimpleNamespace

import pytest

from handoff import faults
from handoff.backend import Shape
from handoff.cases import Case
from handoff.errors import CaseFailure
from handoff.machine.pace import Pace
from handoff.polling import Deadline
from handoff.responses.single import Planned, Sent, cut_late, race_premise
from handoff.responses.waits import Settings


class Stream:
    """A response streaming `rate` tokens a second from its creation, up to `max_tokens`."""

    def __init__(self, rate: float, max_tokens: int) -> None:
        self.rate, self.max_tokens, self.began = rate, max_tokens, time.monotonic()
        self.response = SimpleNamespace(summary=lambda: "HTTP 200, [DONE]")

    def seen(self) -> int:
        return min(self.max_tokens, int(self.rate * (time.monotonic() - self.began)))

    @property
    def finished(self) -> bool:
        return self.seen() >= self.max_tokens


def test_the_cut_waits_for_the_last_seconds_at_the_rate_measured():
    stream = Stream(2000, 2000)
    said = faults.await_last_seconds(stream, stream.seen, 2000, 0.25, "tokens", Deadline(5))
    seen = stream.seen()
    assert 1400 <= seen < 2000, said  # at most 500 to come, the response still open
    assert said.endswith(" tokens/s") and " to come at " in said


def test_the_rate_is_measured_before_the_rest_is_judged_by_it():
    """A response already in its last seconds is cut once its rate is known, not blind."""
    stream = Stream(100, 10_000)
    began = time.monotonic()
    faults.await_last_seconds(stream, stream.seen, 100, 1.0, "tokens", Deadline(5))
    assert time.monotonic() - began >= 0.5  # faults.RATE_WINDOW_S, whatever it is set to


def test_a_response_that_ends_first_missed_the_fault_window():
    stream = Stream(2000, 400)
    with pytest.raises(CaseFailure, match=r"^missed the fault window: the response ended before"):
        faults.await_last_seconds(stream, stream.seen, 10_000, 0.01, "tokens", Deadline(5))


@pytest.mark.parametrize(
    ("case_id", "topology", "late"),
    [
        ("migration_enabled-partition-chat-stream-nats", "decode", True),
        ("migration_enabled-worker_stall-chat-stream-nats", "decode", False),
        ("migration_enabled-partition-chat-stream-nats", "aggregate", False),
        ("partition-completion-nats", "decode_race", False),
    ],
)
def test_only_a_cut_decode_worker_outside_the_race_is_cut_late(case_id, topology, late):
    assert cut_late(Case.from_id(case_id, topology)) is late


def premise(case_id: str, max_tokens: int, pace: Pace | None) -> list[str]:
    """What race_premise says of a request of `max_tokens`, cut after 10 tokens read in 0.1 s."""
    case = Case.from_id(case_id, "decode_race")
    planned = Planned(None, Shape("p", 64, max_tokens), pace, None)
    sent = Sent(None, 0.0, [], None, seen=10, proven_at=0.1)
    return race_premise(case, planned, sent, Settings(stream_timeout_s=5))


def test_the_cut_race_shows_where_the_lost_request_outlasts_the_window():
    assert premise("partition-completion-nats", 3964, Pace(157, 198)) == []


@pytest.mark.parametrize(
    ("max_tokens", "pace"), [(2000, Pace(157, 198)), (1400, None)], ids=["paced", "unpaced"]
)
def test_the_cut_race_is_not_proven_where_the_lost_request_ends_inside_the_window(max_tokens, pace):
    """At 198 tokens/s (or the 100 a second before the fault), the rest ends in under 15 s."""
    [why] = premise("partition-completion-nats", max_tokens, pace)
    assert why.endswith("under 1.5 times the HTTP layer's 10 s window: the race could not show")


def test_the_stall_race_has_no_such_premise():
    assert premise("worker_stall-chat-tcp", 100, Pace(157, 198)) == []
