"""The case model: stable ids, restrictions as data, the published selections and promises."""

import os
import subprocess
import sys

import pytest

from handoff.cases import (
    AXES,
    BROKER,
    TOPOLOGIES,
    Case,
    Promise,
    promise,
    selection,
    unmet,
)
from handoff.errors import HandoffError
from handoff.machine.environment import CACHE_ENV

#: Published ids, pinned here on purpose: CI dashboards key on them, so a change must fail.
PUBLISHED_PRE_MERGE = {
    "aggregate": [
        "migration_enabled-worker_failure-chat-stream-nats",
        "migration_enabled-graceful_shutdown-completion-unary-tcp",
        "migration_disabled-worker_failure-chat-unary-tcp",
        "migration_disabled-graceful_shutdown-completion-stream-nats",
        "max_seq_len_exceeded-worker_failure-completion-stream-tcp",
        "max_seq_len_exceeded-graceful_shutdown-chat-unary-nats",
        "max_seq_len_not_exceeded-worker_failure-completion-unary-nats",
        "max_seq_len_not_exceeded-graceful_shutdown-chat-stream-tcp",
        "migration_enabled-worker_stall-chat-stream-nats",
        "migration_disabled-worker_stall-completion-unary-tcp",
        "max_seq_len_exceeded-worker_stall-chat-stream-nats",
        "max_seq_len_not_exceeded-worker_stall-chat-stream-nats",
        "migration_enabled-drain_expired-chat-stream-nats",
        "migration_disabled-drain_expired-completion-unary-tcp",
        "max_seq_len_exceeded-drain_expired-chat-stream-nats",
        "max_seq_len_not_exceeded-drain_expired-chat-stream-nats",
        "migration_enabled-partition-chat-stream-nats",
        "migration_disabled-partition-completion-unary-tcp",
        "max_seq_len_exceeded-partition-chat-stream-nats",
        "max_seq_len_not_exceeded-partition-chat-stream-nats",
        "migration_enabled-broker_stall-chat-stream-nats",
        "migration_enabled-broker_loss-chat-stream-nats",
        "migration_disabled-broker_stall-completion-unary-nats",
        "migration_disabled-broker_loss-completion-unary-nats",
        "max_seq_len_exceeded-broker_stall-chat-stream-nats",
        "max_seq_len_exceeded-broker_loss-chat-stream-nats",
        "max_seq_len_not_exceeded-broker_stall-chat-stream-nats",
        "max_seq_len_not_exceeded-broker_loss-chat-stream-nats",
        "migration_enabled-stall_past_lease-chat-stream-nats",
        "migration_enabled-stall_past_lease-completion-unary-tcp",
    ],
    "decode": [
        "migration_enabled-worker_failure-chat-stream-nats",
        "migration_disabled-graceful_shutdown-completion-stream-nats",
        "max_seq_len_exceeded-worker_failure-completion-stream-tcp",
        "max_seq_len_not_exceeded-graceful_shutdown-chat-stream-tcp",
        "migration_enabled-worker_stall-chat-stream-nats",
        "migration_enabled-worker_stall-completion-stream-tcp",
        "migration_enabled-drain_expired-chat-stream-nats",
        "migration_enabled-drain_expired-completion-stream-tcp",
        "migration_enabled-partition-chat-stream-nats",
        "migration_enabled-partition-completion-stream-tcp",
        "migration_enabled-broker_stall-chat-stream-nats",
        "migration_enabled-broker_loss-chat-stream-nats",
        "migration_enabled-broker_stall-completion-stream-nats",
        "migration_enabled-broker_loss-completion-stream-nats",
    ],
    "kv_transfer": ["worker_failure-chat-stream-nats", "graceful_shutdown-chat-unary-tcp"],
    "prefill": [
        "migration_enabled-worker_failure-chat-stream-nats",
        "migration_disabled-graceful_shutdown-completion-unary-nats",
        "max_seq_len_exceeded-worker_failure-completion-unary-tcp",
        "max_seq_len_not_exceeded-graceful_shutdown-chat-stream-tcp",
    ],
    "load": [
        "migration_disabled-worker_failure-completion-tcp",
        "migration_enabled-worker_stall-chat-nats",
        "max_seq_len_exceeded-graceful_shutdown-chat-tcp",
        "max_seq_len_not_exceeded-partition-completion-nats",
    ],
    "decode_load": [],
    "join": [
        "migration_enabled-worker_failure-chat-nats",
        "migration_enabled-graceful_shutdown-completion-tcp",
    ],
    "rolling": ["chat-nats", "completion-tcp"],
    "guided": ["migration_enabled-worker_failure-chat-stream-nats"],
    "choices": [],
    "usage": [],
    "stop": ["worker_failure-chat-stream-nats"],
    "stop_after": [],
    "min_tokens": [],
    "frequency_penalty": [],
    "presence_penalty": [],
    "repetition_penalty": [],
    "seeded": [],
    "abandoned": [
        "client_close-chat-nats",
        "close_after_move-completion-tcp",
        "close_in_stall-chat-tcp",
    ],
    "decode_race": ["worker_stall-chat-tcp"],
    "engine_core": [
        "migration_enabled-chat-stream-nats",
        "migration_disabled-completion-unary-tcp",
        "max_seq_len_exceeded-chat-stream-tcp",
        "max_seq_len_not_exceeded-completion-unary-nats",
    ],
    "discovery": [
        "lease_expiry-chat-stream-tcp",
        "lease_revoked-completion-stream-nats",
        "etcd_partition-chat-unary-tcp",
        "etcd_member_loss-completion-unary-tcp",
        "etcd_loss-completion-stream-tcp",
        "stall_past_lease-chat-stream-tcp",
    ],
}


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_pre_merge_keeps_its_published_ids_in_order(name):
    assert [c.id for c in selection(name, "pre_merge")] == PUBLISHED_PRE_MERGE[name]


@pytest.mark.parametrize("name", TOPOLOGIES)
@pytest.mark.parametrize("chosen", ["pre_merge", "nightly", "full"])
def test_every_published_selection_keeps_its_promise(name, chosen):
    assert unmet(name, selection(name, chosen), promise(name, chosen)) == []


@pytest.mark.parametrize(
    ("name", "full"), [("aggregate", 200), ("decode", 96), ("kv_transfer", 16), ("prefill", 64)]
)
def test_nightly_covers_every_triple_in_fewer_rows_than_the_full_product(name, full):
    nightly = selection(name, "nightly")
    assert len({c.id for c in nightly}) == len(nightly) < full == len(selection(name, "full"))
    # The pre-merge rows come first, unchanged: CI history keys on their ids.
    assert [c.id for c in nightly[: len(PUBLISHED_PRE_MERGE[name])]] == PUBLISHED_PRE_MERGE[name]


def test_the_nightly_is_generated_the_same_in_any_process(tmp_path):
    """Generated afresh in another interpreter (an empty cache of generated arrays, another
    hash seed: this one's is random): the same rows in the same order (CI history and shard
    durations key on them)."""
    here = [c.key for t in TOPOLOGIES for c in selection(t, "nightly")]
    probe = (
        "from handoff.cases import TOPOLOGIES, selection; "
        "print('\\n'.join(c.key for t in TOPOLOGIES for c in selection(t, 'nightly')))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "1", CACHE_ENV: str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.split() == here


def test_dropping_any_generated_nightly_row_loses_a_triple():
    nightly = list(selection("kv_transfer", "nightly"))
    kept = promise("kv_transfer", "nightly")
    for i in range(len(PUBLISHED_PRE_MERGE["kv_transfer"]), len(nightly)):
        assert unmet("kv_transfer", nightly[:i] + nightly[i + 1 :], kept)


def test_restricted_rows_are_never_generated():
    for chosen in ("nightly", "full"):
        assert all(c.response == "stream" for c in selection("decode", chosen))
        assert all(c.policy == "migration_enabled" for c in selection("kv_transfer", chosen))


def test_id_joins_the_topology_id_axes_and_round_trips():
    case = Case("migration_disabled", "graceful_shutdown", "completion", "stream", "nats")
    assert case.id == "migration_disabled-graceful_shutdown-completion-stream-nats"
    assert case.key == "aggregate/" + case.id
    assert Case.from_id(case.id) == case
    kv = Case.from_id("graceful_shutdown-chat-unary-tcp", "kv_transfer")
    assert (
        kv.policy == "migration_enabled"
        and kv.key == "kv_transfer/graceful_shutdown-chat-unary-tcp"
    )


def test_check_names_the_pairs_a_broken_selection_misses():
    # Dropping the first row loses every pair that only it covered.
    broken = selection("aggregate", "pre_merge")[1:]
    missing = unmet("aggregate", broken, promise("aggregate", "pre_merge"))
    assert missing == ["policy=migration_enabled & fault=worker_failure"]
    assert "fault=worker_failure & api=chat" not in missing  # another row still covers it


def test_check_catches_a_one_value_swap():
    rows = list(selection("aggregate", "pre_merge"))
    rows[0] = Case.from_id("migration_enabled-graceful_shutdown-chat-stream-nats")
    missing = unmet("aggregate", rows, promise("aggregate", "pre_merge"))
    assert missing == ["policy=migration_enabled & fault=worker_failure"]


def test_each_value_promise_names_a_missing_value():
    rows = selection("kv_transfer", "pre_merge")[:1]
    missing = unmet("kv_transfer", rows, promise("kv_transfer", "pre_merge"))
    assert missing == ["fault=graceful_shutdown", "response=unary", "plane=tcp"]


def test_a_lifecycle_promise_names_each_lifecycle_a_selection_lacks():
    rows = selection("load", "pre_merge")
    assert unmet("load", rows[1:], promise("load", "pre_merge")) == [
        "api=completion & plane=tcp",
        "policy=migration_disabled",
        "fault=worker_failure",
    ]
    # A fault the promise does not name is never asked for.
    assert "fault=broker_loss" not in unmet("load", [], promise("load", "pre_merge"))


def test_a_restricted_value_is_never_reported_missing():
    # decode forbids unary: even the strongest promise does not ask for it.
    missing = unmet("decode", selection("decode", "nightly"), promise("decode", "nightly"))
    assert missing == []
    assert "response=unary" not in unmet("decode", [], Promise(each_value_of=("response",)))


@pytest.mark.parametrize(
    ("case_id", "topology", "message"),
    [
        ("migration_enabled-worker_failure-chat-stream", "aggregate", "malformed aggregate"),
        ("migration_enabled-worker_failure-chat-stream-udp", "aggregate", "unknown plane 'udp'"),
        ("sometimes-worker_failure-chat-stream-nats", "aggregate", "unknown policy 'sometimes'"),
        (
            "migration_enabled-worker_failure-chat-unary-nats",
            "decode",
            "decode cases allow response stream only, not 'unary'",
        ),
        ("migration_enabled-worker_failure-chat-stream-nats", "kv_transfer", "malformed"),
        ("migration_enabled-worker_failure-chat-stream-nats", "mesh", "unknown topology 'mesh'"),
    ],
)
def test_bad_case_ids_are_named(case_id, topology, message):
    with pytest.raises(HandoffError, match=message):
        Case.from_id(case_id, topology)


def test_unknown_selection_is_named():
    with pytest.raises(HandoffError, match="unknown selection 'weekly'"):
        selection("aggregate", "weekly")


def test_every_policy_value_has_a_meaning_in_every_window():
    from handoff.policies import OUTCOMES, POLICIES

    assert list(POLICIES) == list(AXES["policy"])
    windows = {t.fault_window for t in TOPOLOGIES.values()}
    assert set(OUTCOMES) == {(w, p) for w in windows for p in AXES["policy"]}


def test_a_nightly_promise_names_only_the_axes_the_topology_varies():
    """kv_transfer fixes the policy (its ids have none): its nightly promise does not name it."""
    assert "policy" not in promise("kv_transfer", "nightly").describe()
    assert "policy" in promise("aggregate", "nightly").describe()


def test_a_broker_fault_on_the_tcp_plane_is_no_case():
    with pytest.raises(HandoffError, match=r"fault=broker_loss implies plane in \{nats\}: the"):
        Case.from_id("migration_enabled-broker_loss-chat-stream-tcp")
    assert all(c.plane == "nats" for c in selection("aggregate", "full") if c.fault in BROKER)
