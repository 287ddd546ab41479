"""What a request that may not move asks of the frontend, and where a response leaves its
guide: the request bodies Dynamo 1.6.1 reads, and the outcomes each policy expects."""

import pytest

from handoff import lifecycle
from handoff.cases import Case
from handoff.client import Guide, Request
from handoff.policies import OUTCOMES, SERVICE_UNAVAILABLE, expected_outcome
from handoff.responses.waits import STREAM_TIMEOUT_ENV, Settings, fault_env
from handoff_vllm import cpu

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


def test_a_visible_guide_goes_where_the_frontend_reads_it():
    assert Guide(schema=SCHEMA).fields("chat") == {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "handoff", "schema": SCHEMA},
        }
    }
    assert Guide(schema=SCHEMA).fields("completion") == {"guided_json": SCHEMA}
    assert Guide(regex="t[0-9]+").fields("chat") == {"guided_regex": "t[0-9]+"}


def test_a_hidden_guide_is_not_sent():
    """The worker imposes it: nothing of it reaches the frontend."""
    body = Request("chat", True, "m", "p", 8, guide=Guide(regex="t[0-9]+", hidden=True)).body()
    assert body == Request("chat", True, "m", "p", 8).body()


def test_two_choices_go_out_drawn_not_greedy():
    """The frontend refuses n > 1 at temperature 0 (HTTP 400)."""
    body = Request("completion", False, "m", "p", 8, choices=2).body()
    assert (body["n"], body["temperature"]) == (2, 1.0)
    assert "n" not in Request("completion", False, "m", "p", 8).body()


@pytest.mark.parametrize(
    "text, where",
    [
        (" t5 t100 t4095", None),
        ("t5 t100", None),
        # A successor that restarted the guide gives its opening word again, mid-output.
        (" t5 t100 t200 t5 t300", "at character 14: ' t5 t300'"),
        (" t100 t200", "at character 1: ' t100 t200'"),
    ],
)
def test_a_regex_guide_names_the_first_character_it_no_longer_matches(text, where):
    broken = cpu.GUIDE.broken(text)
    assert broken is None if where is None else where in broken


def test_a_json_guide_names_the_first_character_that_is_not_json():
    assert Guide(schema=SCHEMA).broken('{"a": "b"}') is None
    assert "at character 11" in Guide(schema=SCHEMA).broken('{"a": "b"}{"a": "b"}')


@pytest.mark.parametrize("policy", ["migration_enabled", "max_seq_len_not_exceeded"])
@pytest.mark.parametrize("request_kind", ["guided", "choices"])
def test_a_request_that_may_not_move_is_refused_where_another_would_move(policy, request_kind):
    assert (
        expected_outcome("decoding", policy, lifecycle.of("worker_failure"), request_kind)
        == OUTCOMES[("decoding", "migration_disabled")]
    )
    assert expected_outcome("decoding", policy, lifecycle.of("worker_failure")).completes


def test_a_refused_request_over_the_cap_still_counts_the_cap():
    refused = expected_outcome(
        "decoding", "max_seq_len_exceeded", lifecycle.of("graceful_shutdown"), "guided"
    )
    assert (refused.error, refused.max_seq_len_exceeded, refused.failed) == (
        SERVICE_UNAVAILABLE, 1, 1
    )  # fmt: skip


@pytest.mark.parametrize(
    "fault, moves, succeeded",
    [("client_close", 0, 0), ("close_after_move", 1, 1), ("close_in_stall", 0, 0)],
)
def test_a_client_that_leaves_is_counted_by_what_came_before(fault, moves, succeeded):
    outcome = expected_outcome("decoding", "migration_enabled", lifecycle.of(fault))
    assert (outcome.error, outcome.ongoing_request, outcome.succeeded) == (None, moves, succeeded)
    assert outcome.failed == outcome.new_request == 0


@pytest.mark.parametrize(
    "case_id, env",
    [
        ("client_close-chat-nats", {}),
        ("close_after_move-completion-tcp", {}),
        ("close_in_stall-chat-tcp", {STREAM_TIMEOUT_ENV: "7"}),
    ],
)
def test_a_client_leaving_a_stall_meets_the_stream_timeout_that_would_move_it(case_id, env):
    """Without it the frontend could never move the stalled request: its not moving it would
    prove nothing."""
    case = Case.from_id(case_id, "abandoned")
    assert fault_env(case, Settings(stream_timeout_s=7)) == env
    stall = Case.from_id("migration_enabled-worker_stall-chat-stream-nats")
    assert fault_env(stall, Settings(stream_timeout_s=7)) == {STREAM_TIMEOUT_ENV: "7"}
