"""A rolling restart under a steady load, on Dynamo's frontend and mocker workers: a frontend
that does not move the drained workers' requests fails the case, each lost request named and
the counters against the hand-overs."""

from handoff import runner
from handoff.cases import Case
from handoff.policies import POLICIES
from handoff.runner import Settings
from handoff_mocker import MockerBackend

ROLLING = Case.from_id("chat-nats", "rolling")


def test_a_frontend_that_moves_nothing_fails_each_drained_request_and_the_counts(tmp_path):
    result = runner.run_case(
        MockerBackend(), ROLLING, tmp_path, Settings(), 90, POLICIES["migration_disabled"]
    )
    assert not result.verdict.passed
    reasons = result.verdict.reasons
    # By the error's code, not "503" anywhere: a request's random id can hold those digits.
    lost = {
        r.partition(" (")[0] for r in reasons if r.startswith("request ") and "'code': 503" in r
    }
    failed = next(e for e in result.history.events if e.name == "metrics_read").data["counts"]
    assert lost and failed["failed"] >= len(lost), reasons
    assert f"migration counter failed = {failed['failed']}, expected 0" in reasons
