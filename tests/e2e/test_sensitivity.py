"""Each verdict can fail: a real system under test, misconfigured or misbehaving for real,
makes the matching case fail with a reason that names what went wrong, and leaves nothing
running behind it."""

import os
import signal

import pytest

from handoff.cases import Case
from handoff.policies import POLICIES
from handoff.ports import bindable
from handoff.runner import Settings, run_case
from handoff_mocker import MockerBackend

SETTINGS = Settings(keep_logs=True)
STREAM_ENABLED = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")


def assert_ports_free(result):
    ready = next(e for e in result.history.events if e.name == "ready")
    assert ready.data["ports"] and all(bindable(p) for p in ready.data["ports"])


def failed_reasons(folder, **misconfiguration) -> str:
    """Run the migration-enabled stream case against a misconfigured system; it must fail."""
    result = run_case(MockerBackend(), STREAM_ENABLED, folder, SETTINGS, 60, **misconfiguration)
    assert not result.verdict.passed
    assert_ports_free(result)
    return " | ".join(result.verdict.reasons)


def test_frontend_with_migration_off_fails_a_case_that_expects_migration(tmp_path):
    reasons = failed_reasons(tmp_path, frontend_policy=POLICIES["migration_disabled"])
    assert "the stream carried an error frame" in reasons
    assert "finish_reason None, expected 'length'" in reasons
    assert "migration counter succeeded = 0, expected 1" in reasons
    assert (tmp_path / "history.json").exists() and (tmp_path / "frontend.log").exists()


def test_stream_cut_short_when_no_worker_is_left_to_migrate_to(tmp_path):
    reasons = failed_reasons(tmp_path, roles=("aggregate",))
    assert "the stream carried an error frame" in reasons
    assert "None completion tokens in usage, expected 800" in reasons
    assert "migration counter failed = 1, expected 0" in reasons


class BadFlagMocker(MockerBackend):
    """A worker command line the mocker rejects: the worker exits during start-up."""

    def worker(self, role, model, plane, ports):
        launch = super().worker(role, model, plane, ports)
        return type(launch)([*launch.argv, "--no-such-flag"], launch.env)


def test_start_up_failure_names_the_process_and_its_log(tmp_path):
    result = run_case(BadFlagMocker(), STREAM_ENABLED, tmp_path, SETTINGS, timeout_s=60)
    assert not result.verdict.passed
    assert result.verdict.phase == "launch"
    reason = result.verdict.reasons[0]
    assert "worker-0-aggregate exited with code 2 during start-up" in reason
    assert "unrecognized arguments: --no-such-flag" in reason


class FreezingMocker(MockerBackend):
    """Workers that stop answering (SIGSTOP) the moment the request is in flight."""

    def holders(self, workers):
        for worker in workers:
            os.kill(worker.process.pid, signal.SIGSTOP)
        return super().holders(workers)


@pytest.mark.parametrize("response", ["stream", "unary"])
def test_a_hung_system_fails_within_the_case_timeout(tmp_path, response):
    case = Case.from_id(f"migration_enabled-worker_failure-completion-{response}-tcp")
    result = run_case(FreezingMocker(), case, tmp_path, SETTINGS, timeout_s=12)
    assert not result.verdict.passed
    assert result.verdict.phase == "request_sent"
    assert "timed out waiting for a worker to hold the request" in result.verdict.reasons[0]
    assert result.seconds < 12 + 15  # the case budget plus the teardown bound
    assert_ports_free(result)


@pytest.mark.parametrize("response", ["stream", "unary"])
def test_a_request_over_before_the_fault_window_fails_the_case(tmp_path, response):
    case = Case.from_id(f"migration_enabled-worker_failure-chat-{response}-nats")
    result = run_case(MockerBackend(), case, tmp_path, Settings(max_tokens=3), timeout_s=60)
    assert not result.verdict.passed
    assert result.verdict.phase in ("request_sent", "holder_found")
    assert result.verdict.reasons[0].startswith("missed the fault window: the response ended")
    assert_ports_free(result)
