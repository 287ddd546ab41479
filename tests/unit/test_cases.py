"""The case model: stable ids, the published selections, and the pairwise check."""

import pytest

from handoff.cases import (
    AGGREGATE_NIGHTLY,
    AGGREGATE_PRE_MERGE,
    Case,
    selection,
    uncovered_pairs,
)
from handoff.errors import HandoffError

PUBLISHED_PRE_MERGE = [
    "migration_enabled-worker_failure-chat-stream-nats",
    "migration_enabled-graceful_shutdown-completion-unary-tcp",
    "migration_disabled-worker_failure-chat-unary-tcp",
    "migration_disabled-graceful_shutdown-completion-stream-nats",
    "max_seq_len_exceeded-worker_failure-completion-stream-tcp",
    "max_seq_len_exceeded-graceful_shutdown-chat-unary-nats",
    "max_seq_len_not_exceeded-worker_failure-completion-unary-nats",
    "max_seq_len_not_exceeded-graceful_shutdown-chat-stream-tcp",
]


def test_pre_merge_keeps_its_published_ids_in_order():
    assert [c.id for c in selection("aggregate", "pre_merge")] == PUBLISHED_PRE_MERGE


def test_id_joins_axis_values_in_order_and_round_trips():
    case = Case("migration_disabled", "graceful_shutdown", "completion", "stream", "nats")
    assert case.id == "migration_disabled-graceful_shutdown-completion-stream-nats"
    assert case.key == "aggregate/" + case.id
    assert Case.from_id(case.id) == case


def test_nightly_is_the_full_product():
    ids = [c.id for c in AGGREGATE_NIGHTLY]
    assert len(ids) == len(set(ids)) == 4 * 2 * 2 * 2 * 2
    assert set(PUBLISHED_PRE_MERGE) <= set(ids)


def test_published_selections_cover_every_pair():
    assert uncovered_pairs(AGGREGATE_PRE_MERGE) == []
    assert uncovered_pairs(AGGREGATE_NIGHTLY) == []


def test_check_names_the_pairs_a_broken_selection_misses():
    # Dropping the first row loses every pair that only it covered.
    broken = AGGREGATE_PRE_MERGE[1:]
    missing = uncovered_pairs(broken)
    assert "policy=migration_enabled & fault=worker_failure" in missing
    assert "policy=migration_enabled & api=chat" in missing
    # Pairs another row still covers are not reported.
    assert "fault=worker_failure & api=chat" not in missing


def test_check_catches_a_one_value_swap():
    # Same size, one plane flipped: some pair must go missing and be named.
    rows = list(AGGREGATE_PRE_MERGE)
    rows[0] = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")
    assert "policy=migration_enabled & plane=nats" in uncovered_pairs(rows)


@pytest.mark.parametrize(
    ("case_id", "message"),
    [
        ("migration_enabled-worker_failure-chat-stream", "malformed case id"),
        ("migration_enabled-worker_failure-chat-stream-udp", "unknown plane 'udp'"),
        ("sometimes-worker_failure-chat-stream-nats", "unknown policy 'sometimes'"),
    ],
)
def test_bad_case_ids_are_named(case_id, message):
    with pytest.raises(HandoffError, match=message):
        Case.from_id(case_id)


def test_unknown_selection_and_topology_are_named():
    with pytest.raises(HandoffError, match="unknown selection 'weekly'"):
        selection("aggregate", "weekly")
    with pytest.raises(HandoffError, match="no pre_merge selection for topology 'decode'"):
        selection("decode", "pre_merge")


def test_every_policy_value_has_a_meaning():
    from handoff.cases import POLICIES as POLICY_AXIS
    from handoff.policies import POLICIES

    assert list(POLICIES) == list(POLICY_AXIS)
