"""handoff's own fault lifecycles, each attribute pinned to what the fault families of the case
model said before a fault was a value (cases.SILENT, STALLS, BROKER, DRAINS, ENGINE, DISCOVERY,
ABANDONS, PAST_LEASE): a lifecycle that maps a fault differently changes a verdict."""

import pytest

from handoff import lifecycle
from handoff.cases import FAULTS
from handoff.responses.waits import STREAM_TIMEOUT_ENV, Settings

NATS = "DYN_NATS_REQUEST_TIMEOUT_SECS"
SETTINGS = Settings(graceful_bound_s=2.0, stream_timeout_s=3)
#: fault: first signal, how it meets the response, stops its holder, healed at the move,
#: outlives the lease, becomes past its lease, gauges read after, pool tag, layout, the room
#: it needs, its own wait, the frontend's environment.
EXPECTED = {
    "worker_failure": ("SIGKILL", "moves", 0, 0, 0, None, 1, "", None, None, 0, []),
    "graceful_shutdown": ("SIGTERM", "moves", 0, 0, 0, None, 1, "", None, 2.0, 2.0, []),
    "worker_stall": (
        "SIGSTOP", "unheard", 1, 1, 0, "stall_past_lease", 1, "", None, None, 6,
        [STREAM_TIMEOUT_ENV],
    ),
    "drain_expired": ("SIGTERM", "moves", 0, 0, 0, None, 1, "drain1s", None, 1, 1, []),
    "partition": (
        "nftables drop", "unheard", 0, 1, 0, None, 1, "", None, None, 6, [STREAM_TIMEOUT_ENV]
    ),
    "broker_stall": ("SIGSTOP", "off_path", 0, 0, 0, None, 1, "", None, None, 0, [NATS]),
    "broker_loss": ("SIGKILL", "off_path", 0, 0, 0, None, 1, "", None, None, 0, [NATS]),
    "stall_past_lease": (
        "SIGSTOP", "unheard", 1, 0, 1, None, 1, "", None, None, 6, [STREAM_TIMEOUT_ENV]
    ),
    "engine_failure": ("SIGKILL", "moves", 0, 0, 0, None, 1, "engine10s", None, None, 12, []),
    "lease_expiry": ("SIGKILL", "moves", 0, 0, 0, None, 1, "", "etcd1", None, 0, []),
    "lease_revoked": ("lease revoke", "off_path", 0, 0, 0, None, 1, "", "etcd1", None, 0, []),
    "etcd_partition": (
        "nftables drop", "off_path", 0, 0, 0, None, 1, "", "etcd3-pinned", None, 0, []
    ),
    "etcd_member_loss": ("SIGKILL", "off_path", 0, 0, 0, None, 1, "", "etcd3", None, 0, []),
    "etcd_restart": ("SIGKILL", "off_path", 0, 0, 0, None, 0, "", "etcd1", None, 0, []),
    "etcd_loss": ("SIGKILL", "off_path", 0, 0, 0, None, 0, "", "etcd1-lease15", None, 0, []),
    "client_close": ("close", "leaves", 0, 0, 0, None, 1, "", None, None, 0, []),
    "close_after_move": ("SIGKILL", "leaves", 0, 0, 0, None, 1, "", None, None, 0, []),
    "close_in_stall": (
        "SIGSTOP", "leaves", 1, 0, 0, None, 1, "", None, None, 0, [STREAM_TIMEOUT_ENV]
    ),
}  # fmt: skip


def attributes(found: lifecycle.Lifecycle) -> tuple:
    return (
        found.first_signal, found.meets, int(found.stops_holder), int(found.heals_on_move),
        int(found.outlives_lease), found.past_lease, int(found.idle_after),
        (found.worker_env or ("",))[0], found.layout.label if found.layout else None,
        found.runs_on(SETTINGS), found.wait(SETTINGS)[0], sorted(found.frontend_env(SETTINGS)),
    )  # fmt: skip


def test_every_fault_of_the_case_model_has_a_lifecycle():
    assert set(EXPECTED) == set(FAULTS)


@pytest.mark.parametrize("fault", FAULTS)
def test_each_lifecycle_does_what_its_fault_family_did(fault):
    assert attributes(lifecycle.of(fault)) == EXPECTED[fault]


def test_a_client_that_leaves_after_no_worker_fault_injects_nothing():
    assert lifecycle.of("client_close").inject is None
    assert lifecycle.of("close_after_move").leaves_once_moved
