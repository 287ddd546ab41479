"""A request that must not move and a client that leaves, made to go wrong for real: a guided
request whose guide the frontend cannot see is moved, and a worker that ignores its client's
going fails the case by its name."""

import signal
from dataclasses import replace

from handoff import faults, runner
from handoff.cases import Case
from handoff.client import InFlight
from handoff.runner import Settings
from handoff_mocker import MockerBackend

SETTINGS = Settings(keep_logs=True)


class HiddenGuideMocker(MockerBackend):
    """Its guide is the worker's own, not sent (the mocker ignores guides anyway): the frontend
    takes the request for one it may move, as a frontend without Dynamo's fix 7930 would take
    a guided one."""

    def guide(self, api):
        return replace(super().guide(api), hidden=True)


def test_a_guided_request_the_frontend_cannot_see_is_moved_and_fails_the_case(tmp_path):
    case = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp", "guided")
    result = runner.run_case(HiddenGuideMocker(), case, tmp_path, SETTINGS, timeout_s=60)
    assert not result.verdict.passed
    reasons = " | ".join(result.verdict.reasons)
    assert "requires an API error after the fault, but the response ended without one" in reasons
    assert "migration counter succeeded = 1, expected 0" in reasons
    assert "migration counter failed = 0, expected 1" in reasons
    # The same request with its guide in sight is refused the move: the case passes.
    seen = runner.run_case(MockerBackend(), case, tmp_path / "seen", SETTINGS, timeout_s=60)
    assert seen.verdict.passed, seen.verdict.reasons


def test_a_worker_that_ignores_its_clients_going_fails_the_case_by_name(tmp_path, monkeypatch):
    """The worker holding the request is stopped (SIGSTOP of its tree) the moment its client
    hangs up: it never stops the request, and its gauge never answers."""
    holders = []
    find_holder, close = faults.find_holder, InFlight.close

    def found(*args):
        holders.append(find_holder(*args))
        return holders[-1]

    def hang_up_on_a_stopped_worker(inflight):
        holders[-1].process.signal_tree(signal.SIGSTOP)
        return close(inflight)

    monkeypatch.setattr(faults, "find_holder", found)
    monkeypatch.setattr(InFlight, "close", hang_up_on_a_stopped_worker)
    case = Case.from_id("client_close-chat-tcp", "abandoned")
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, timeout_s=60)
    assert not result.verdict.passed and holders
    reasons = " | ".join(result.verdict.reasons)
    stopped = holders[-1].name
    assert f"{stopped} went on with the request after its client left" in reasons
    assert f"timed out waiting for {stopped} to stop the request" in reasons
