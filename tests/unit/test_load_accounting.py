"""The accounting of a load case on requests this test places: where each request is, whether
it was decoding or queued at the fault, what the counters must rise by, and the bound."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from handoff import lifecycle
from handoff.cases import Case
from handoff.client import Chunk, Request, Response
from handoff.errors import CaseFailure, HandoffError
from handoff.history import History, percentile, resumption_s
from handoff.metrics import MigrationCounts
from handoff.policies import expected_outcome
from handoff.responses.evidence import Owed, judged
from handoff.responses.load import (
    DECODING,
    QUEUED,
    UNKNOWN,
    Held,
    busiest,
    classify,
    counted_as_new,
    each_prompt,
    expected_counts,
    load_bound,
    settled,
)
from handoff.responses.recovery import REJOIN_TOKENS, short
from handoff.responses.waits import QUEUE_WAIT_SLOWER_BY, Settings, sized_for_queues
from handoff.runs.report import _cells
from handoff.runs.results import CaseRecord
from handoff_mocker import MockerBackend

MAX_TOKENS = 900


def held(n: int, worker: str, stream: bool, tokens: int = 0) -> Held:
    request = Request("chat", stream, "m", f"t{100 + n}", MAX_TOKENS, f"id-{n}")
    token = {"choices": [{"delta": {"content": " t1"}}]}
    response = Response(chunks=[Chunk(0.01 * i, token) for i in range(tokens)])
    inflight = SimpleNamespace(request=request, response=response, finished=False)
    return Held(n, inflight, worker)


def test_every_cut_request_counts_once_and_the_cap_counts_every_request_sent():
    enabled = expected_counts(
        expected_outcome("decoding", "migration_enabled", lifecycle.of("worker_failure")), 3, 8
    )
    assert enabled.counts() == {
        "ongoing_request": 3,
        "new_request": 0,
        "max_seq_len_exceeded": 0,
        "succeeded": 3,
        "failed": 0,
    }
    capped = expected_counts(
        expected_outcome("decoding", "max_seq_len_exceeded", lifecycle.of("worker_failure")), 3, 8
    )
    assert capped.error is not None
    assert (capped.ongoing_request, capped.max_seq_len_exceeded, capped.failed) == (3, 8, 3)


def seen(ongoing: int, new: int, failed: int = 0) -> MigrationCounts:
    return MigrationCounts(ongoing, new, 0, 3 - failed, failed)


@pytest.mark.parametrize(
    ("counts", "queued", "shifted"),
    [
        (seen(3, 0), 1, 0),  # as expected: nothing to explain
        (seen(2, 1), 1, 1),  # the queued request's stream was not the frontend's yet
        (seen(1, 2), 2, 2),
        (seen(1, 2), 1, 0),  # more counted new than were queued
        (seen(2, 0), 1, 0),  # one request lost, not counted either way
        (seen(2, 2), 1, 0),  # a new_request too many: a second move
        (seen(2, 1, failed=1), 1, 1),  # the split explained; the failure still fails below
    ],
)
def test_only_queued_requests_may_be_counted_as_new_requests(counts, queued, shifted):
    expected = expected_counts(
        expected_outcome("decoding", "migration_enabled", lifecycle.of("worker_failure")), 3, 8
    )
    resolved, raced = counted_as_new(expected, counts, queued)
    assert raced == shifted
    assert resolved.ongoing_request + resolved.new_request == 3
    assert (resolved.new_request, resolved.succeeded) == (shifted, 3)


@pytest.mark.parametrize(
    ("requests", "ready"),
    [
        ([(True, 10), (True, 0), (False, 0)], True),  # one decoding, one queued, one unary
        ([(True, 2), (True, 0), (False, 0)], False),  # a stream with too few tokens yet
        ([(True, 0), (True, 0), (False, 0)], False),  # two streams waiting, one queue slot
        ([(True, 10), (True, 10), (True, 10)], False),  # three decoding on two slots
    ],
)
def test_a_worker_is_settled_only_when_its_streams_fit_its_slots(requests, ready):
    mine = [held(n, "w", stream, tokens) for n, (stream, tokens) in enumerate(requests)]
    assert settled(mine, decoding_at_once=2, in_flight_tokens=5) is ready


@pytest.mark.parametrize(
    ("requests", "unary_state"),
    [
        ([(True, 10), (False, 0), (False, 0)], UNKNOWN),  # a slot and a queue place left
        ([(True, 10), (True, 0), (False, 0)], DECODING),  # the queue is the stream's
        ([(True, 10), (True, 12), (False, 0)], QUEUED),  # both slots are the streams'
    ],
)
def test_a_unary_request_is_placed_only_where_its_workers_slots_leave_no_doubt(
    requests, unary_state
):
    mine = [held(n, "w", stream, tokens) for n, (stream, tokens) in enumerate(requests)]
    classify(mine, decoding_at_once=2)
    assert [h.state for h in mine if h.request.stream] == [
        DECODING if tokens else QUEUED for stream, tokens in requests if stream
    ]
    assert {h.state for h in mine if not h.request.stream} == {unary_state}
    assert [h.chunks_at_fault for h in mine] == [tokens for _, tokens in requests]


def test_without_a_limit_every_request_decodes():
    mine = [held(0, "w", False), held(1, "w", False)]
    classify(mine, decoding_at_once=None)
    assert {h.state for h in mine} == {DECODING}


def test_the_fault_goes_to_the_worker_holding_the_most():
    workers = [SimpleNamespace(name=n) for n in ("a", "b", "c")]
    requests = [held(0, "a", True), held(1, "b", True), held(2, "b", False), held(3, "c", True)]
    assert busiest(requests, workers).name == "b"


def test_the_bound_allows_every_request_again_in_the_rounds_the_survivors_slots_need():
    requests = [held(n, f"w{n % 3}", n % 2 == 0, 20) for n in range(8)]
    classify(requests, decoding_at_once=2)
    case = Case("migration_enabled", "worker_failure", "chat", "stream", "nats", "load")
    bound, why = load_bound(requests, case, Settings(), 0.0, 0.2, 2, 2, None)
    # 20 tokens in 0.2 s: 100 tokens/s, 9 s a request; 8 requests on 2 x 2 slots: 2 rounds.
    assert bound == pytest.approx(10.0 + 4.0 * 2 * 9.0 + 5.0)
    assert "2 round(s) of 900 tokens at 100 tokens/s" in why and "10 s nats request" in why


def test_no_stream_decoding_and_no_speed_of_its_own_leaves_nothing_to_bound_by():
    requests = [held(n, "w", False) for n in range(3)]
    classify(requests, decoding_at_once=2)
    case = Case("migration_enabled", "worker_failure", "chat", "stream", "tcp", "load")
    with pytest.raises(CaseFailure, match="nothing to bound the rest by"):
        load_bound(requests, case, Settings(), 0.0, 0.2, 2, 2, None)


def test_a_load_case_reports_the_p50_and_p99_pause_of_the_streams_the_fault_cut():
    history = History()
    history.record_at("fault_sent", history.started + 1.0)
    for end in (3.0, 7.5, 5.0):
        history.record_at("response_finished", history.started + end)
    rows = [{"cut": True, "fault_to_next_token_ms": ms} for ms in (300.0, 100.0, 2000.0)]
    rows += [
        {"cut": False, "fault_to_next_token_ms": 5.0},  # a survivor's: not a move
        {"cut": True, "failed": True, "fault_to_next_token_ms": 8.0},  # its error frame
        {"cut": True, "stream": False},  # unary: no next token
    ]
    history.record("load_accounted", requests=rows)
    phases = history.phases()
    assert phases["fault_to_next_token_ms"] == 300.0
    assert phases["fault_to_next_token_p99_ms"] == 2000.0
    assert phases["fault_to_end_s"] == 6.5  # to the last response's end, not the first's
    case = CaseRecord("load/x", True, "verdict", 9.0, phases=phases)
    assert _cells(case)[3] == "300/2000"


def test_the_pause_is_measured_to_the_token_after_the_longest_gap_from_the_fault():
    chunks = [0.1, 0.2, 1.05, 1.1, 2.6, 2.65]  # tokens on their way at 1.0, then the move
    assert resumption_s(chunks, 1.0) == pytest.approx(1.6)
    assert resumption_s([0.5], 1.0) is None and resumption_s([0.1, 0.2], 1.0) is None


def test_a_percentile_is_one_of_the_values():
    assert [percentile([3.0, 1.0, 2.0], q) for q in (1, 50, 99)] == [1.0, 2.0, 3.0]


STALL = Case.from_id("migration_enabled-worker_stall-chat-nats", "load")


def test_a_silent_fault_under_load_gets_a_stream_timeout_longer_than_its_queues():
    backend, settings = MockerBackend(), Settings()
    sized = sized_for_queues(STALL, settings, backend)
    whole_s = backend.nominal_response_s(STALL, backend.shape(STALL, 0))
    # 8 requests on 2 surviving workers of 2 slots: one round waits queued behind another.
    assert sized.stream_timeout_s >= QUEUE_WAIT_SLOWER_BY * whole_s > settings.stream_timeout_s
    assert (
        sized_for_queues(STALL, replace(settings, stream_timeout_s=60), backend).stream_timeout_s
        == 60
    )
    kill = Case.from_id("migration_enabled-worker_failure-chat-nats", "load")
    one_request = Case.from_id("migration_enabled-worker_stall-chat-stream-nats")
    assert sized_for_queues(kill, settings, backend) == settings
    assert sized_for_queues(one_request, settings, backend) == settings


def test_a_backend_that_cannot_tell_its_speed_cannot_size_the_timeout():
    class Unknown(MockerBackend):
        def nominal_response_s(self, case, shape):
            return None

    with pytest.raises(HandoffError, match="stream timeout of load/migration_enabled-worker_stall"):
        sized_for_queues(STALL, Settings(), Unknown())


def test_a_probe_of_the_deployment_carries_no_request_id_of_a_load_case():
    request = Request("chat", True, "m", "t100", MAX_TOKENS, "id-0")
    probe = short(request)
    assert (probe.stream, probe.max_tokens, probe.request_id) == (False, REJOIN_TOKENS, None)


def test_a_request_that_completes_with_another_text_than_its_own_fails_naming_the_token():
    """Each request of a load case is judged against its own prompt's text: a response whose
    fourth token differs fails, though it is whole; the text of another prompt fails too."""
    backend = MockerBackend()
    outcome = expected_outcome("decoding", "migration_enabled", lifecycle.of("worker_failure"))
    words = [f" t{i}" for i in range(MAX_TOKENS)]
    frames = [
        {"id": "x", "choices": [{"delta": {"content": w}, "finish_reason": None}]} for w in words
    ]
    frames[-1]["choices"][0]["finish_reason"] = "length"
    frames.append({"id": "x", "choices": [], "usage": {"completion_tokens": MAX_TOKENS}})
    response = Response(status=200, chunks=[Chunk(0.01 * i, f) for i, f in enumerate(frames)])
    response.done = True
    request = held(0, "a", True).request

    def problems(text: str | None, cut: bool) -> list[str]:
        owed = Owed(text, "the reference")
        policy = "migration_enabled"
        found = judged(request, response, owed, outcome, policy, cut, backend, lambda: None)
        return found.problems

    assert problems("".join(words), True) == []
    (problem,) = problems("".join(words[:3]) + " t999" + "".join(words[4:]), True)
    assert problem.startswith("the migrated text departs from the reference at token 4")
    assert problems(None, False) == []  # a backend that knows no text judges the tokens alone


def test_each_prompt_of_a_load_case_is_the_least_usage_says_or_unknown():
    """The re-issued context of each moved load request is judged with its prompt's length as
    the frontend tokenized it: the least usage.prompt_tokens of the case's requests, whose
    prompts are of one length (a re-issued one says its prompt and what its context carried).
    Where none says it, it is unknown, and the case fails, saying so."""
    requests = [held(n, "a", True) for n in range(4)]

    def saying(usage: dict | None) -> Response:
        frame = {"id": "x", "choices": [], **({"usage": usage} if usage else {})}
        return Response(status=200, chunks=[Chunk(0.0, frame)])

    for h, said in zip(requests, (23, 58, 31, 23), strict=True):
        h.inflight.response = saying({"prompt_tokens": said})
    assert each_prompt(requests) == 23  # 58 and 31: their prompt and what they carried
    requests[0].inflight.response = saying(None)  # a stream its client dropped
    assert each_prompt(requests) == 23
    for h in requests:
        h.inflight.response = saying(None)
    with pytest.raises(CaseFailure, match=r"no request gives usage\.prompt_tokens"):
        each_prompt(requests)
