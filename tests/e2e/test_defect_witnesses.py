"""The known defects' witnesses read off the real system, Dynamo's frontend and mocker: the
expired drain's (the worker's runtime giving up its drain, the frontend's unclassified end) and
the lapsed lease's (the worker's registrations read again from the store, none listed). Each
case is its defect only with the witness in its notes."""

import pytest

from handoff import runner
from handoff.cases import Case
from handoff.policies import KNOWN_DEFECTS
from handoff.runner import Settings
from handoff.verdict import KNOWN_DEFECT
from handoff_mocker import MockerBackend

TIMEOUT_S = 120


@pytest.mark.parametrize(
    ("case_id", "fault", "seen"),
    [
        (
            "migration_enabled-drain_expired-chat-stream-nats",
            "drain_expired",
            "'s log shows its drain timing out; the frontend's log shows 1 stream(s) ended as "
            "'runtime.unclassified'",
        ),
        (
            "migration_enabled-stall_past_lease-completion-unary-tcp",
            "stall_past_lease",
            "; the frontend lists none of them",
        ),
    ],
)
def test_the_defect_is_its_witness_read_off_the_system(case_id, fault, seen, tmp_path):
    case = Case.from_id(case_id, "aggregate")
    verdict = runner.run_case(MockerBackend(), case, tmp_path, Settings(), TIMEOUT_S).verdict
    assert verdict.outcome == KNOWN_DEFECT, verdict.summary()
    defect = KNOWN_DEFECTS[fault]
    (note,) = [n for n in verdict.notes if n.startswith(f"{defect.issue}'s witness: ")]
    assert seen in note, note
