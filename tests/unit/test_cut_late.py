"""Where a decode worker is cut off: where the backend's re-issued request waits for the one the
cut-off worker lost (vLLM on Dynamo 1.6.1), in its response's last half stream timeout, so
that the lost request has ended before the frontend moves it; except in the race case, which
cuts early on purpose and is not proven where the lost request could not outlast the HTTP
layer's window."""

import time
from types import SimpleNamespace

import pytest

from handoff import faults
from handoff.backend import Shape
from handoff.cases import Case
from handoff.client import Chunk, Request, Response
from handoff.errors import CaseFailure, MissedWindow
from handoff.machine.polling import Deadline
from handoff.responses.pace import Pace
from handoff.responses.single import Planned, Sent, cut_late, race_premise
from handoff.responses.waits import Settings


class Stream:
    """A response streaming `rate` tokens a second from its creation, up to `max_tokens`, which
    ends as `ending` frames say once it has streamed them all."""

    def __init__(self, rate: float, max_tokens: int, ending: list[dict] | None = None) -> None:
        self.rate, self.max_tokens, self.began = rate, max_tokens, time.monotonic()
        self.request = Request("chat", True, "m", "p", max_tokens)
        frames = ending if ending is not None else [whole(max_tokens)]
        self.response = Response(200, chunks=[Chunk(0.0, f) for f in frames], done=True)
        self.response.streamed = True

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


def whole(tokens: int) -> dict:
    """The last frame of a response that ran to its length."""
    done = {"delta": {"content": "t1"}, "finish_reason": "length"}
    return {"choices": [done], "usage": {"completion_tokens": tokens}}


def test_a_response_that_ends_complete_first_missed_the_fault_window():
    """The harness waited past the response's end: its miss, not the system's failure."""
    stream = Stream(2000, 400)
    with pytest.raises(MissedWindow, match=r"^the response had ended complete before its last"):
        faults.await_last_seconds(stream, stream.seen, 10_000, 0.01, "tokens", Deadline(5))


def test_a_response_the_system_ends_short_before_any_fault_fails_it():
    """A stream cut before any fault, with an error frame and no finish reason, is the system's
    failure, named so; never a missed window."""
    cut = [{"choices": [{"delta": {"content": "t1"}}]}, {"error": {"code": 500}}]
    stream = Stream(2000, 400, ending=cut)
    stream.response.error = {"message": "Internal server error", "code": 500}
    with pytest.raises(CaseFailure, match=r"^the system ended the response before its last"):
        faults.await_last_seconds(stream, stream.seen, 10_000, 0.01, "tokens", Deadline(5))


HOLDS_UP = SimpleNamespace(reissue_waits_for_lost_request=True)


@pytest.mark.parametrize(
    ("case_id", "topology", "late"),
    [
        ("migration_enabled-partition-chat-stream-nats", "decode", True),
        ("max_seq_len_not_exceeded-partition-completion-stream-tcp", "decode", True),
        ("migration_disabled-partition-chat-stream-nats", "decode", False),  # nothing re-issued
        ("max_seq_len_exceeded-partition-chat-stream-nats", "decode", False),
        ("migration_enabled-worker_stall-chat-stream-nats", "decode", False),
        ("migration_enabled-partition-chat-stream-nats", "aggregate", False),
        ("partition-completion-nats", "decode_race", False),
    ],
)
def test_only_a_cut_decode_worker_whose_request_moves_is_cut_late(case_id, topology, late):
    assert cut_late(Case.from_id(case_id, topology), HOLDS_UP) is late


def test_a_backend_whose_reissue_waits_for_nothing_is_cut_as_soon_as_proven():
    case = Case.from_id("migration_enabled-partition-chat-stream-nats", "decode")
    assert not cut_late(case, SimpleNamespace(reissue_waits_for_lost_request=False))


def premise(case_id: str, max_tokens: int, pace: Pace | None, seen: int = 10) -> list[str]:
    """What race_premise says of a request of `max_tokens`, cut after `seen` tokens that came
    at 100 a second from the first, 0.5 s after the sending."""
    case = Case.from_id(case_id, "decode_race")
    planned = Planned(None, Shape("p", 64, max_tokens), pace, None)
    frames = [SimpleNamespace(text=" t1", at=0.5 + n / 100) for n in range(seen)]
    inflight = SimpleNamespace(response=SimpleNamespace(chunks=frames))
    sent = Sent(inflight, 0.0, [], None, seen=seen, proven_at=frames[-1].at if frames else 0.5)
    return race_premise(case, planned, sent, Settings(stream_timeout_s=5))


NOT_SHOWN = "under 1.5 times the HTTP layer's 10 s window: the race could not show"


@pytest.mark.parametrize(
    ("max_tokens", "seen", "pace"),
    [
        (3964, 10, Pace(157, 198)),
        (2980, 10, Pace(157, 198)),  # 15.0 s to come at the fastest pace: the bound itself
        (1511, 10, None),  # 15.01 s at the 100 a second the stream came at
    ],
)
def test_the_cut_race_shows_where_the_lost_request_outlasts_the_window(max_tokens, seen, pace):
    assert premise("partition-completion-nats", max_tokens, pace, seen) == []


@pytest.mark.parametrize(
    ("max_tokens", "seen", "pace"),
    [
        (2700, 10, Pace(157, 198)),  # 17.1 s at the slowest pace, 13.6 s at the fastest
        (3964, 1010, Pace(157, 198)),  # 14.9 s once the tokens seen are counted
        (1400, 10, None),  # 13.9 s at 100 a second from the first frame (not from the sending)
    ],
)
def test_the_cut_race_is_not_proven_where_the_lost_request_ends_inside_the_window(
    max_tokens, seen, pace
):
    [why] = premise("partition-completion-nats", max_tokens, pace, seen)
    assert why.endswith(NOT_SHOWN)


def test_the_cut_race_is_not_proven_where_its_pace_is_unknown():
    [why] = premise("partition-completion-nats", 3964, None, seen=1)
    assert why.startswith("the pace is unknown")


def test_the_stall_race_has_no_such_premise():
    assert premise("worker_stall-chat-tcp", 100, Pace(157, 198)) == []
