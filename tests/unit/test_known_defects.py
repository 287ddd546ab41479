"""A case that runs into a known upstream defect on purpose: judged by Dynamo's documented
promise, it is a strict expected failure only when it fails with every sign of that defect.
The real runs of the expired drain and of the stall past the lease fail this way on Dynamo
1.6.1 (the mocker's pre-merge cases, `nox -s mocker_pre_merge`); a Dynamo that keeps the promise
cannot be run here, so its pass is shown on a verdict."""

from handoff.policies import KNOWN_DEFECTS
from handoff.runs.results import CaseRecord, tally
from handoff.verdict import Verdict, against_known_defect

DRAIN = KNOWN_DEFECTS["drain_expired"]
#: The reasons a real drain_expired case gave on Dynamo 1.6.1 (benchmarks/RESULTS.md).
SEEN = [
    "the stream carried an error frame: {'message': 'Internal server error', "
    "'type': 'internal_server_error', 'code': 500}",
    "finish_reason None, expected 'length'",
    "the frontend counted no migration at all: worker-1-aggregate, which was faulted, was not "
    "serving the request",
    "migration counter ongoing_request = 0, expected 1",
]


def test_a_failure_with_every_sign_of_the_defect_is_that_defect():
    verdict = against_known_defect(Verdict(False, list(SEEN), "verdict"), DRAIN)
    assert not verdict.passed
    assert verdict.upstream_defect == DRAIN.describe()
    assert verdict.upstream_defect.startswith("Dynamo issue 13952: ")


def test_a_failure_of_another_kind_stays_a_failure():
    """A migration that happened but was miscounted is not the defect: a plain failure."""
    other = [r for r in SEEN if "counted no migration" not in r]
    verdict = against_known_defect(Verdict(False, other, "verdict"), DRAIN)
    assert not verdict.passed and verdict.upstream_defect == ""
    assert verdict.reasons == other


def test_a_pass_fails_saying_the_fix_has_arrived():
    verdict = against_known_defect(Verdict(True, [], "verdict"), DRAIN)
    assert not verdict.passed and verdict.upstream_defect == ""
    (reason,) = verdict.reasons
    assert reason.startswith("passed, but Dynamo issue 13952 was expected to fail it")
    assert "the fix has arrived; remove its entry from policies.KNOWN_DEFECTS" in reason


def test_a_case_without_a_known_defect_is_left_alone():
    verdict = Verdict(True, [], "verdict")
    assert against_known_defect(verdict, KNOWN_DEFECTS.get("worker_failure")) is verdict


def test_the_tally_counts_known_defects_apart_and_not_as_failures():
    cases = [
        CaseRecord("a", True, "verdict", 1.0),
        CaseRecord("b", False, "verdict", 1.0, upstream_defect=DRAIN.describe()),
        CaseRecord("c", False, "launch", 1.0),
    ]
    assert tally(cases) == "3 cases: 1 passed, 1 failed, 1 failed as known upstream defects"
    assert [c.verdict for c in cases] == ["PASS", "XFAIL upstream", "FAIL in launch"]
    assert [c.failed for c in cases] == [False, False, True]


LEASE = KNOWN_DEFECTS["stall_past_lease"]
#: The reason a real stall_past_lease case gave on Dynamo 1.6.1 (benchmarks/RESULTS.md).
NEVER_ROUTED = (
    "worker-1-aggregate, healed after its fault, was never routed to again: timed out waiting "
    "for worker-1-aggregate to serve a request again; last seen: 152 request(s), HTTP 200"
)


def test_a_resumed_worker_never_routed_to_again_is_the_lapsed_lease_defect():
    verdict = against_known_defect(Verdict(False, [NEVER_ROUTED], "verdict"), LEASE)
    assert verdict.upstream_defect.startswith("Dynamo issue 3493: ")


def test_a_stall_that_never_outlived_the_lease_is_a_plain_failure():
    """The fault's own proof failed (the frontend kept listing the worker): not the defect."""
    reason = "the stall did not outlive worker-1-aggregate's discovery lease: still listed 30 s"
    verdict = against_known_defect(Verdict(False, [reason], "verdict"), LEASE)
    assert not verdict.passed and verdict.upstream_defect == ""
