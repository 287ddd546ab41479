"""A response the policy refuses to move ends with its error, and a client may leave, but what
was delivered before the end must still be true: on Dynamo's real frontend and mocker, a worker
whose engine emits a wrong third token (its replay trace altered, so that the engine itself
gives it) fails the case by that token, where the move was refused, where it completes, and
where the client left."""

import json

import pytest

from handoff import runner
from handoff.cases import Case
from handoff.runner import Settings
from handoff.verdict import FAILED, PASSED
from handoff_mocker import MockerBackend, origins

SETTINGS = Settings(keep_logs=True)
TIMEOUT_S = 90
#: The token the engine gives wrong (from 1), and its place instead (its worker's own token,
#: nine places on: a token of the right worker, out of its order).
WRONG_AT, INSTEAD = 3, 9


@pytest.fixture
def wrong_third_token(monkeypatch):
    """Every mocker worker's engine replays its output with its third token replaced."""
    write = origins.write_trace

    def altered(folder, port, length):
        path = write(folder, port, length)
        row = json.loads(path.read_text())
        tokens = row["output_token_ids"]
        tokens[WRONG_AT - 1] = tokens[0] + INSTEAD
        path.write_text(json.dumps(row) + "\n")
        return path

    monkeypatch.setattr(origins, "write_trace", altered)


@pytest.mark.parametrize(
    ("case_id", "topology"),
    [
        ("migration_disabled-graceful_shutdown-chat-stream-tcp", "aggregate"),
        ("migration_enabled-graceful_shutdown-chat-stream-tcp", "aggregate"),
        ("client_close-chat-tcp", "abandoned"),  # what the client read before it left
    ],
)
def test_a_wrong_token_before_the_end_fails_the_case(
    case_id, topology, wrong_third_token, tmp_path
):
    case = Case.from_id(case_id, topology)
    verdict = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, TIMEOUT_S).verdict
    assert verdict.outcome == FAILED, verdict.summary()
    broken = [r for r in verdict.reasons if r.startswith(f"token {WRONG_AT} is worker #")]
    assert broken, verdict.summary()
    assert f"token {INSTEAD + 1} (modulo" in broken[0], broken


def test_the_refused_move_passes_with_its_engine_true(tmp_path):
    """The same case, the engine's output untouched: it passes, so the failure above is the
    token's."""
    case = Case.from_id("migration_disabled-graceful_shutdown-chat-stream-tcp", "aggregate")
    verdict = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, TIMEOUT_S).verdict
    assert verdict.outcome == PASSED, verdict.summary()
