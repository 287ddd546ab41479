"""A rolling restart's counters against the hand-overs its workers' logs show, on readings and
requests this test gives."""

from types import SimpleNamespace

from handoff.metrics import MigrationCounts
from handoff.responses.rolling import maybe_queued, move_problems


def counts(ongoing=0, new=0, succeeded=0, failed=0) -> MigrationCounts:
    return MigrationCounts(ongoing, new, 0, succeeded, failed)


def test_one_move_each_of_either_kind_within_the_queued_ones_passes():
    assert move_problems(counts(ongoing=7, new=2, succeeded=9), handovers=9, queued=2) == []


def test_a_move_too_many_or_too_few_fails():
    said = move_problems(counts(ongoing=9, new=1, succeeded=10), handovers=9, queued=3)
    assert said[0].startswith("the frontend counted 10 moves") and len(said) == 2
    assert move_problems(counts(ongoing=8, succeeded=8), handovers=9, queued=0)[0].endswith(
        "show 9 hand-overs"
    )


def test_a_started_stream_counted_new_fails():
    said = move_problems(counts(ongoing=7, new=2, succeeded=9), handovers=9, queued=1)
    assert said == [
        "migration counter new_request = 2, but only 1 hand-over(s) were of a request that "
        "had streamed nothing when its worker drained"
    ]


def test_a_failed_move_fails():
    assert move_problems(counts(ongoing=3, succeeded=2, failed=1), handovers=3, queued=0) == [
        "migration counter succeeded = 2, expected 3",
        "migration counter failed = 1, expected 0",
    ]


def sent(stream: bool, token_at: list[float], request_id: str):
    chunks = [SimpleNamespace(at=t, text="t1") for t in token_at]
    request = SimpleNamespace(stream=stream, request_id=request_id)
    return SimpleNamespace(request=request, response=SimpleNamespace(chunks=chunks)), None


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
