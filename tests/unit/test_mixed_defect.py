"""A worker set of two releases whose model cards differ (1.5.1 and 1.6.1): a request moved off
a worker of one release finds none of the other. Judged over the reasons the mixed cases
recorded on 2026-12-07 (`nox -s mixed -- 1.5.1 1.6.1`)."""

import pytest

from handoff import policies, releases
from handoff.releases.mixes import Mix
from handoff.verdict import FAILED, KNOWN_DEFECT, NOT_PROVEN, Verdict, against_known_defect

ID = "id d53dbfe3-79d3-4acc-97fb-892961865dba"
ROLLED = f"request 2 (stream, {ID}, served by worker-0-aggregate, worker-1-aggregate)"
RECORDED = {
    "alternate, 1.5.1's frontend": [
        "the stream carried an error frame: {'message': 'Internal server error', 'type': "
        "'internal_server_error', 'code': 500}",
        "finish_reason None, expected 'length'",
        "None completion tokens in usage, expected 400",
        "migration counter succeeded = 0, expected 1",
        "migration counter failed = 1, expected 0",
    ],
    "alternate, 1.6.1's frontend, unary": [
        "expected a complete response, got HTTP 503: {'message': 'Service temporarily "
        "unavailable', 'type': 'Service Unavailable', 'code': 503}",
        "migration counter succeeded = 0, expected 1",
        "migration counter failed = 1, expected 0",
    ],
    "replacements, a rolling upgrade": [
        f"{ROLLED}: the stream carried an error frame: {{'message': 'Internal server error', "
        f"'type': 'internal_server_error', 'code': 500}}",
        f"{ROLLED}: finish_reason None, expected 'length'",
        "request 9 (unary, id 27297458-ab77-4113-9595-95c72d769e68, served by "
        "worker-1-aggregate, worker-2-aggregate): expected a complete response, got HTTP 500: "
        "{'message': 'Internal server error', 'type': 'Internal Server Error', 'code': 500, "
        "'details': {'backend_status': 500}}",
        "the frontend counted 13 moves (ongoing_request 13, new_request 0); the workers' logs "
        "show 6 hand-overs, and 7 request(s) were sent, or handed over, while a drained worker "
        "was still listed",
        "migration counter succeeded = 6, expected 13",
        "migration counter failed = 7, expected 0",
    ],
    "replacements, a request sent once the kept release's last worker was drained": [
        "request 13 (unary, id 75c9563f-0cfa-4f20-82a4-8efd8e2cd921, served by ): expected a "
        "complete response, got HTTP 404: {'message': ''}",
        "request 13 (unary, id 75c9563f-0cfa-4f20-82a4-8efd8e2cd921, served by ): no worker's "
        "log names it",
        "migration counter succeeded = 6, expected 13",
        "migration counter failed = 7, expected 0",
    ],
}
DRAIN_MOVED_NOTHING = "no request was handed over from worker-2-aggregate: its drain moved nothing"


def judged(reasons, seen=True, unproven=()):
    verdict = Verdict(False, list(reasons), "verdict", unproven=list(unproven))
    verdict.witnessed = {"rejected_workers": (seen, "the frontend's log shows 1 rejection(s)")}
    return against_known_defect(verdict, policies.MIXED_WORKER_SET)


@pytest.mark.parametrize("mix", sorted(RECORDED))
def test_each_recorded_failure_with_its_witness_is_the_defect(mix):
    assert judged(RECORDED[mix]).outcome == KNOWN_DEFECT


def test_the_drain_that_moved_nothing_is_the_defects_own_and_noted():
    verdict = judged(RECORDED["replacements, a rolling upgrade"], unproven=[DRAIN_MOVED_NOTHING])
    assert verdict.outcome == KNOWN_DEFECT
    assert any(DRAIN_MOVED_NOTHING in note for note in verdict.notes)
    other = judged(RECORDED["replacements, a rolling upgrade"], unproven=["a boundary unseen"])
    assert other.outcome == NOT_PROVEN


@pytest.mark.parametrize(
    "extra",
    [
        "the client received 380 tokens, expected 400: 20 lost",
        "expected a complete response, got HTTP 404: {'message': 'Not found', 'type': 'x', "
        "'code': 404}",
    ],
)
def test_a_reason_it_does_not_explain_is_a_plain_failure(extra):
    assert judged([*RECORDED["alternate, 1.5.1's frontend"], extra]).outcome == FAILED


def test_without_its_witness_it_is_a_plain_failure():
    assert judged(RECORDED["alternate, 1.5.1's frontend"], seen=False).outcome == FAILED


def test_a_request_that_moved_is_no_sign_of_it():
    """A move counted failed is its sign: a case whose moves all succeeded shows none."""
    reasons = ["finish_reason None, expected 'length'"]
    assert judged(reasons).outcome == FAILED


@pytest.mark.parametrize(
    ("how", "beside", "expected"),
    [
        ("alternate", "1.5.1", True),
        ("replacements", "1.5.1", True),
        ("frontend", "1.5.1", False),
        ("prefill", "1.5.1", False),
        ("alternate", "1.6.0", False),
    ],
)
def test_it_is_expected_only_of_a_worker_set_of_releases_whose_cards_differ(how, beside, expected):
    """The installed release here is 1.6.1; 1.6.0's card is 1.6.1's."""
    assert releases.current().version == "1.6.1"
    mix = Mix(how, beside, "/venv/bin/python")
    assert (policies.mixed_defect(mix) is policies.MIXED_WORKER_SET) is expected
