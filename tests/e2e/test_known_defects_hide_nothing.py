"""A known upstream defect hides nothing: for each entry of policies.KNOWN_DEFECTS, its case on
the real mocker fails as that defect, a strict expected failure; the same case beside a second,
real failure fails plainly, naming the defect and the reason it does not explain.

The second failure: a frontend whose migration cap is 1 token (`max_seq_len_exceeded`'s flags),
which counts the case's prompt as over the cap when it arrives, so `max_seq_len_exceeded` reads
1 where the case's policy expects 0. Neither defect moves that counter."""

import pytest

from handoff import runner
from handoff.cases import Case
from handoff.policies import KNOWN_DEFECTS, POLICIES
from handoff.runner import Settings
from handoff_mocker import MockerBackend

SETTINGS = Settings(keep_logs=True)
#: Each known defect's cheapest case (the drain's takes about 6 s, the lease's and the cut from
#: etcd's about 26 s), and its topology.
CASES = {
    "drain_expired": ("migration_enabled-drain_expired-chat-stream-nats", "aggregate"),
    "stall_past_lease": ("migration_enabled-stall_past_lease-completion-unary-tcp", "aggregate"),
    "etcd_partition": ("etcd_partition-chat-unary-tcp", "discovery"),
}
COUNTED_AT_ARRIVAL = "migration counter max_seq_len_exceeded = 1, expected 0"


def run(folder, fault, **misconfiguration):
    backend = MockerBackend()
    timeout_s = float(backend.setting("case_timeout_s"))
    case = Case.from_id(*CASES[fault])
    return runner.run_case(backend, case, folder, SETTINGS, timeout_s, **misconfiguration)


def test_every_known_defect_has_a_case_here():
    assert set(CASES) == set(KNOWN_DEFECTS)


@pytest.mark.parametrize("fault", sorted(KNOWN_DEFECTS))
def test_the_defect_alone_is_a_strict_expected_failure(tmp_path, fault):
    verdict = run(tmp_path, fault).verdict
    assert not verdict.passed
    assert verdict.upstream_defect == KNOWN_DEFECTS[fault].describe(), verdict.reasons
    assert COUNTED_AT_ARRIVAL not in verdict.reasons


@pytest.mark.parametrize("fault", sorted(KNOWN_DEFECTS))
def test_a_second_failure_beside_the_defect_is_a_plain_failure(tmp_path, fault):
    defect = KNOWN_DEFECTS[fault]
    capped = POLICIES["max_seq_len_exceeded"]
    verdict = run(tmp_path, fault, frontend_policy=capped).verdict
    assert not verdict.passed and verdict.upstream_defect == "", verdict.reasons
    said = " | ".join(verdict.reasons)
    assert all(sign in said for sign in defect.signature), verdict.reasons  # the defect met
    assert COUNTED_AT_ARRIVAL in verdict.reasons
    named = verdict.reasons[-1]
    assert named.startswith(f"not {defect.issue} alone: it does not explain: "), named
    assert COUNTED_AT_ARRIVAL in named
