"""verdict.judge on recorded responses and counters (no system under test needed)."""

import json

import pytest
from frontend_replay import events, fetch, recorded, replay

from handoff.client import Chunk, Response
from handoff.faults import FaultReport
from handoff.metrics import MigrationCounts
from handoff.policies import OUTCOMES
from handoff.verdict import FAILED, NOT_PROVEN, PASSED, response_problems, transfer_problems
from handoff.verdict import judge as judge_outcome

MAX_TOKENS = 8
SIGKILL = FaultReport("worker_failure", "worker-0", 1, ("SIGKILL",), False)


def streamed(tokens: int, finish: str | None = "length", error: dict | None = None) -> Response:
    chunks = [
        Chunk(0.0, {"choices": [{"delta": {"content": f" t{i}"}, "finish_reason": None}]})
        for i in range(tokens)
    ]
    if finish:
        chunks.append(Chunk(0.0, {"choices": [{"delta": {}, "finish_reason": finish}]}))
        chunks.append(Chunk(0.0, {"choices": [], "usage": {"completion_tokens": tokens}}))
    return Response(status=200, chunks=chunks, error=error, done=True, streamed=True)


def counts(ongoing=1, new=0, exceeded=0, ok=1, failed=0) -> MigrationCounts:
    return MigrationCounts(ongoing, new, exceeded, ok, failed)


def judge(policy, response, counts, fault, max_tokens, mode, window="decoding"):
    outcome = OUTCOMES[(window, policy)]
    return judge_outcome(outcome, policy, response, counts, fault, max_tokens, mode)


SERVICE_UNAVAILABLE = {"message": "Service temporarily unavailable", "code": 503}


def test_completed_migration_passes():
    verdict = judge("migration_enabled", streamed(8), counts(), SIGKILL, 8, "exact")
    assert verdict.passed, verdict.reasons


def test_short_response_fails_with_token_count():
    verdict = judge("migration_enabled", streamed(5), counts(), SIGKILL, 8, "exact")
    assert "5 completion tokens in usage, expected 8" in verdict.reasons


def test_cut_stream_fails_with_its_error_frame():
    response = streamed(3, finish=None, error=SERVICE_UNAVAILABLE)
    verdict = judge("migration_enabled", response, counts(), SIGKILL, 8, "exact")
    assert not verdict.passed
    assert any("error frame" in r for r in verdict.reasons)
    assert "finish_reason None, expected 'length'" in verdict.reasons


def test_disabled_policy_requires_an_api_error():
    failed = counts(ok=0, failed=1)
    verdict = judge("migration_disabled", streamed(8), failed, SIGKILL, 8, "exact")
    assert any("requires an API error" in r for r in verdict.reasons)
    erred = Response(status=503, error=SERVICE_UNAVAILABLE)
    assert judge("migration_disabled", erred, failed, SIGKILL, 8, "exact").passed


def test_transport_failure_is_not_an_api_error():
    response = Response(exception="ConnectionError: reset")
    verdict = judge("migration_disabled", response, counts(0, 0, 0, 0, 1), SIGKILL, 8, "exact")
    assert any("connection failed" in r for r in verdict.reasons)


def test_exact_mode_rejects_a_duplicate_migration_lower_bound_accepts_it():
    twice = counts(ongoing=2, ok=2)
    exact = judge("migration_enabled", streamed(8), twice, SIGKILL, 8, "exact")
    assert "migration counter ongoing_request = 2, expected 1" in exact.reasons
    lower = judge("migration_enabled", streamed(8), twice, SIGKILL, 8, "lower_bound")
    assert lower.passed, lower.reasons


@pytest.mark.parametrize("mode", ["exact", "lower_bound"])
def test_new_request_migration_always_fails(mode):
    verdict = judge("migration_enabled", streamed(8), counts(new=1), SIGKILL, 8, mode)
    assert "migration counter new_request = 1, expected 0" in verdict.reasons


def test_missing_migration_fails_in_lower_bound_mode_too():
    verdict = judge(
        "migration_enabled",
        streamed(8),
        counts(0, 0, 0, 0, 0),
        SIGKILL,
        8,
        "lower_bound",
    )
    assert "migration counter ongoing_request = 0, expected at least 1" in verdict.reasons


def test_a_response_the_drained_worker_finished_before_the_kill_is_a_missed_window():
    """Over, complete, before the SIGKILL and nothing counted: the drain finished it, the fault
    came late: the harness's miss, not proven, never the system's failure."""
    late = FaultReport("graceful_shutdown", "worker-1", 2, ("SIGTERM", "SIGKILL"), True)
    verdict = judge("migration_enabled", streamed(8), counts(0, 0, 0, 0, 0), late, 8, "exact")
    assert verdict.outcome == NOT_PROVEN and verdict.reasons == []
    (missed,) = verdict.unproven
    assert missed.startswith(
        "missed window: the response had ended complete before SIGKILL reached worker-1, and "
        "the frontend counted no migration"
    )


def test_a_response_cut_short_before_the_kill_is_judged_not_missed():
    """Over before the SIGKILL, but with an error and no migration counted: the drain's own
    outcome, judged against the policy (here a failure), never a missed window."""
    late = FaultReport("drain_expired", "worker-1", 2, ("SIGTERM",), True)
    cut = streamed(3, None, {"message": "Internal server error", "code": 500})
    verdict = judge("migration_enabled", cut, counts(0, 0, 0, 0, 0), late, 8, "exact")
    assert verdict.outcome == FAILED and verdict.unproven == []
    assert any("counted no migration at all" in r for r in verdict.reasons)


@pytest.mark.parametrize(
    ("policy", "response", "counted"),
    [
        ("migration_enabled", streamed(8), counts()),
        ("migration_disabled", streamed(3, None, SERVICE_UNAVAILABLE), counts(ok=0, failed=1)),
    ],
)
def test_a_request_handed_over_at_sigterm_passes_though_over_before_the_kill(
    policy, response, counted
):
    """vLLM with no grace period migrates (or refuses to) at the SIGTERM: the fault took
    effect, and the frontend counted it, before the bound ran out."""
    moved = FaultReport("graceful_shutdown", "worker-1", 2, ("SIGTERM", "SIGKILL"), True)
    assert judge(policy, response, counted, moved, 8, "exact").reasons == []


def test_a_sigkill_after_the_response_ended_is_a_missed_window():
    late = FaultReport("worker_failure", "worker-1", 2, ("SIGKILL",), True)
    verdict = judge("migration_enabled", streamed(8), counts(), late, 8, "exact")
    assert verdict.outcome == PASSED  # a migration was counted: the fault reached the request
    verdict = judge("migration_enabled", streamed(8), counts(0, 0, 0, 0, 0), late, 8, "exact")
    assert verdict.unproven[0].startswith("missed window: the response had ended complete before")


def test_a_prefill_fault_is_a_new_request_migration():
    new = counts(ongoing=0, new=1)
    verdict = judge("migration_enabled", streamed(8), new, SIGKILL, 8, "exact", window="prefill")
    assert verdict.passed, verdict.reasons
    wrong = judge("migration_enabled", streamed(8), counts(), SIGKILL, 8, "exact", "prefill")
    assert "migration counter new_request = 0, expected 1" in wrong.reasons


def test_no_migration_at_all_names_the_faulted_worker():
    none = counts(0, 0, 0, 0, 0)
    verdict = judge("migration_enabled", streamed(8), none, SIGKILL, 8, "exact")
    assert any("counted no migration at all: worker-0" in r for r in verdict.reasons)


@pytest.mark.parametrize("details", [{"cached_tokens": 0}, {}, None])
def test_a_prompt_computed_for_the_case_passes(details):
    """0 cached tokens, or an engine that does not report them (no details, or null)."""
    response = streamed(8)
    response.chunks[-1].data["usage"]["prompt_tokens_details"] = details
    verdict = judge("migration_enabled", response, counts(), SIGKILL, 8, "exact")
    assert verdict.passed, verdict.reasons


def test_a_prompt_served_from_a_prefix_cache_fails_the_case():
    """The case's prompt was left in a worker's cache by an earlier request: not computed."""
    response = streamed(8)
    response.chunks[-1].data["usage"]["prompt_tokens_details"] = {"cached_tokens": 16}
    verdict = judge("migration_enabled", response, counts(), SIGKILL, 8, "exact")
    assert verdict.reasons == [
        "usage.prompt_tokens_details.cached_tokens is 16, expected 0: the prompt was served "
        "from a prefix cache, not computed for this case"
    ]


def test_transfer_evidence():
    assert transfer_problems(0.5, 0.42) == []
    assert "no transfer happened" in transfer_problems(0.05, 0.42)[0]
    assert "unproven" in transfer_problems(None, 0.42)[0]


def test_a_response_the_drained_worker_finished_inside_the_bound_is_a_missed_window():
    """The worker drained the request on SIGTERM and exited inside the bound: no forced
    disconnect came, so nothing was in flight to migrate. Not "the worker was not serving"."""
    drained = FaultReport("graceful_shutdown", "worker-1", 2, ("SIGTERM",), False, True)
    verdict = judge("migration_enabled", streamed(8), counts(0, 0, 0, 0, 0), drained, 8, "exact")
    assert verdict.outcome == NOT_PROVEN and verdict.reasons == []
    assert verdict.unproven[0].startswith(
        "missed window: the response had ended complete in the graceful bound after SIGTERM"
    )


def test_only_a_stream_must_end_with_done():
    """`[DONE]` closes an SSE stream; a unary response has none to send."""
    unary = streamed(8)
    unary.streamed = unary.done = False
    assert judge("migration_enabled", unary, counts(), SIGKILL, 8, "exact").passed
    cut = streamed(8)
    cut.done = False
    verdict = judge("migration_enabled", cut, counts(), SIGKILL, 8, "exact")
    assert verdict.reasons == ["the stream ended without its closing data: [DONE] frame"]


@pytest.mark.parametrize(
    ("name", "window", "policy"),
    [
        ("refused_mid_stream", "decoding", "migration_disabled"),
        ("refused_unary", "decoding", "migration_disabled"),
        ("capped_mid_stream", "decoding", "max_seq_len_exceeded"),
        ("refused_before_first_token", "prefill", "migration_disabled"),
    ],
)
def test_the_migration_paths_recorded_errors_satisfy_a_policy_that_must_fail(name, window, policy):
    """Dynamo's real answers where it refuses or caps a migration: a 503 frame after HTTP 200
    mid-stream, a plain HTTP 503 where no header had gone out."""
    response = replay(name)
    assert response.error["code"] == 503
    assert response_problems(OUTCOMES[(window, policy)], policy, response, 8) == []


def with_error_frame(frame: dict) -> str:
    """The recorded refused stream, its 503 frame replaced by `frame`."""
    body = events(recorded("refused_mid_stream")["body"])
    at = next(n for n, event in enumerate(body) if '"error"' in event)
    return "".join([*body[:at], f"data: {json.dumps({'error': frame})}\n\n", *body[at + 1 :]])


DRAIN_TIMED_OUT = {"message": "Internal server error", "type": "internal_server_error", "code": 500}
BAD_REQUEST = {"message": "max_tokens must be positive", "type": "Bad Request", "code": 400}
NOT_FOUND = "HTTP 404: {'message': 'Model not found', 'type': 'Not Found', 'code': 404}"


@pytest.mark.parametrize(
    ("response", "came"),
    [
        (lambda: replay("unknown_model_stream"), NOT_FOUND),
        (lambda: replay("unknown_model_unary"), NOT_FOUND),
        (lambda: replay("refused_mid_stream", with_error_frame(DRAIN_TIMED_OUT)),
         f"an SSE error frame: {DRAIN_TIMED_OUT}"),
        (lambda: fetch(400, "application/json", [json.dumps(BAD_REQUEST)], True),
         f"HTTP 400: {BAD_REQUEST}"),
        (lambda: fetch(500, "application/json",
                       [json.dumps({"message": "Service temporarily unavailable", "code": 503})],
                       False),
         "HTTP 500: {'message': 'Service temporarily unavailable', 'code': 503}"),
    ],
    ids=["404-stream", "404-unary", "500-frame", "400", "503-body-under-500"],
)  # fmt: skip
@pytest.mark.parametrize("policy", ["migration_disabled", "max_seq_len_exceeded"])
def test_an_error_other_than_the_migration_paths_fails_a_policy_that_must_fail(
    policy, response, came
):
    """The real 404 of a frontend asked for a model it does not serve (recorded), and errors
    of the kinds Dynamo gives elsewhere (a drain that timed out: 500 frames), are not the
    refusal the policy promises: the reason names what was expected and what came."""
    problems = response_problems(OUTCOMES[("decoding", policy)], policy, response(), 8)
    assert problems == [
        f"policy {policy} requires the migration path's error 503 'Service temporarily "
        f"unavailable' (HTTP 503, or an SSE error frame once streaming), but got {came}"
    ]
