"""A rolling restart's counters against the hand-overs its workers' logs show, on readings and
requests this test gives."""

from types import SimpleNamespace

import pytest

from handoff.backend import Shape
from handoff.errors import HandoffError
from handoff.metrics import MigrationCounts
from handoff.responses.rolling import (
    OUTLAST_MARGIN,
    maybe_queued,
    maybe_rerouted,
    move_problems,
    outlasting_window,
)


def counts(ongoing=0, new=0, succeeded=0, failed=0) -> MigrationCounts:
    return MigrationCounts(ongoing, new, 0, succeeded, failed)


def test_one_move_each_of_either_kind_within_the_queued_ones_passes():
    assert move_problems(counts(7, 2, 9), handovers=9, queued=2, rerouted=0) == []


def test_a_request_rerouted_from_a_drained_worker_may_add_one_new_request():
    assert move_problems(counts(9, 1, 10), handovers=9, queued=0, rerouted=1) == []
    said = move_problems(counts(9, 2, 11), handovers=9, queued=0, rerouted=1)
    assert said[0].startswith("the frontend counted 11 moves")


def test_the_reroute_allowance_never_covers_an_ongoing_move_too_many():
    """A move counted twice (or a stream moved back and forth) reads as one ongoing_request more
    than the logs' hand-overs: the allowance is for new_request only."""
    said = move_problems(counts(10, 0, 10), handovers=9, queued=0, rerouted=1)
    assert said[0].startswith("the frontend counted 10 moves (ongoing_request 10, new_request 0)")


def test_a_move_too_many_or_too_few_fails():
    said = move_problems(counts(10, 0, 10), handovers=9, queued=3, rerouted=0)
    assert said[0].startswith("the frontend counted 10 moves")
    assert move_problems(counts(8, 0, 8), handovers=9, queued=0, rerouted=4)[0].startswith(
        "the frontend counted 8 moves"
    )


def test_a_started_stream_counted_new_fails():
    said = move_problems(counts(7, 2, 9), handovers=9, queued=1, rerouted=0)
    assert said == [
        "migration counter new_request = 2, but only 1 hand-over(s) were of a request that "
        "had streamed nothing when its worker drained"
    ]


def test_a_failed_move_fails():
    assert move_problems(counts(3, 0, 2, 1), handovers=3, queued=0, rerouted=0) == [
        "migration counter succeeded = 2, expected 3",
        "migration counter failed = 1, expected 0",
    ]


def sent(stream: bool, token_at: list[float], request_id: str, sent_at: float = 0.0):
    chunks = [SimpleNamespace(at=t, text="t1") for t in token_at]
    request = SimpleNamespace(stream=stream, request_id=request_id)
    inflight = SimpleNamespace(request=request, response=SimpleNamespace(chunks=chunks))
    inflight.sent_at = sent_at
    return inflight, None


def test_a_hand_over_may_be_queued_for_unary_requests_and_streams_with_nothing_yet():
    steady = SimpleNamespace(
        sent=[
            sent(True, [1.0, 2.0], "streamed"),  # tokens before w0's drain at 3: not queued
            sent(True, [4.0], "waiting"),  # its first token after the drain
            sent(False, [9.0], "unary"),
            sent(True, [1.0], "stayed"),  # never handed over
        ],
        drained_at={"w0": 3.0, "w1": 5.0},
    )
    served = {
        "streamed": ["w0", "w2"],
        "waiting": ["w0", "w1", "w3"],  # two hand-overs: before 3 nothing, before 5 a token
        "unary": ["w1", "w2"],
        "stayed": ["w2"],
    }
    assert maybe_queued(steady, served) == 2


def test_a_request_sent_while_a_drained_worker_was_listed_may_be_rerouted():
    steady = SimpleNamespace(
        sent=[
            sent(True, [], "before", sent_at=2.0),  # before w0's drain
            sent(True, [], "during", sent_at=3.5),  # while w0 drained and still listed
            sent(True, [], "taken", sent_at=3.6),  # during, but w0's log names it
            sent(True, [], "after", sent_at=6.0),  # once w0 was dropped
        ],
        drained_at={"w0": 3.0},
        unlisted_at={"w0": 4.0},
        gone_at={"w0": 5.0},  # unlisted before it was gone: its hand-over could not go back
    )
    served = {"before": ["w1"], "during": ["w1"], "taken": ["w0", "w1"], "after": ["w1"]}
    assert maybe_rerouted(steady, served) == 1


def test_a_hand_over_from_a_worker_gone_while_still_listed_may_be_rerouted_once():
    """Measured on vLLM's CPU engine: a drained worker SIGKILLed at its bound 4 ms before the
    frontend was seen to drop it; the request it held was counted moved twice (5 ongoing, 1 new
    for 5 hand-overs). Only a hand-over away from a worker gone before it was unlisted may be."""
    steady = SimpleNamespace(
        sent=[sent(False, [], "raced", sent_at=1.0), sent(True, [], "later", sent_at=1.0)],
        drained_at={"w0": 1.1, "w1": 20.0},
        gone_at={"w0": 3.51, "w1": 21.0},
        unlisted_at={"w0": 3.515, "w1": 21.9},
    )
    served = {"raced": ["w0", "w1", "w2"], "later": ["w1", "w2"]}
    # raced: away from w0 (gone 3.51 < unlisted 3.515) and from w1 (21.0 < 21.9); later: w1
    assert maybe_rerouted(steady, served) == 3
    steady.gone_at = {"w0": 3.6, "w1": 22.0}  # each unlisted before it was gone: no reroute
    assert maybe_rerouted(steady, served) == 0


def drained_deployment(nominal_s):
    """A deployment whose backend says a response takes `nominal_s` (None: it cannot say)."""
    backend = SimpleNamespace(
        shape=lambda case, variant: Shape("t1 t2", 2, 900),
        nominal_response_s=lambda case, shape: nominal_s,
    )
    return SimpleNamespace(backend=backend)


def test_a_drain_waits_for_a_request_young_enough_to_outlast_it_even_on_a_faster_engine():
    """A 6 s response, were the engine 1.5x faster, takes 4 s: sent within 2 s, it still runs
    past a 2 s graceful bound."""
    window = outlasting_window(drained_deployment(6.0), None, 900, graceful_bound_s=2.0)
    assert window == pytest.approx(6.0 / OUTLAST_MARGIN - 2.0)
    assert outlasting_window(drained_deployment(None), None, 900, 2.0) is None


def test_responses_too_short_to_outlast_the_drain_are_refused_in_one_line():
    with pytest.raises(HandoffError, match="raise the backend's rolling max_tokens"):
        outlasting_window(drained_deployment(2.5), None, 900, graceful_bound_s=2.0)
