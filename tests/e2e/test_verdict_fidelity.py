"""Verdicts in both directions and to the last moment, on the real frontend and mocker: a
frontend that migrates where the policy forbids it, a migration counted after the verdict's
reading, a drain that finishes inside the graceful bound, a frontend that dies or stops
answering mid-case, a detached child left holding a port, and start-ups that never finish.
Each failure is made to happen for real; each reason is checked against the case's history."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import psutil
import pytest
from leaks import marked, ports_held
from misbehaving import DetachedChild, kill_strays, strays_under

from handoff import faults, runner
from handoff.cases import Case
from handoff.client import InFlight, Request
from handoff.deployment import Deployment
from handoff.machine.polling import Deadline, poll_until
from handoff.metrics import MigrationCounts, scrape
from handoff.policies import ENABLED_LIMIT, POLICIES, Policy
from handoff.responses import recovery, single
from handoff.runner import Settings
from handoff.verdict import NOT_PROVEN
from handoff_mocker import MockerBackend

SETTINGS = Settings(keep_logs=True)


def events(result, name):
    return [e.data for e in result.history.events if e.name == name]


def assert_nothing_left(result, started):
    """Every process of the case is gone and every port it leased is free."""
    for deployment in started:
        for process in deployment.processes:
            assert process.exit_code() is not None or not psutil.pid_exists(process.pid)
    teardown = events(result, "teardown_done")[0]
    assert teardown["ports"] and ports_held(teardown["ports"]) == {}


@pytest.fixture
def started(monkeypatch):
    """The deployments the test's cases start, as handoff recorded them (pids, folder)."""
    seen: list[Deployment] = []
    start = Deployment.start

    def recording_start(self, deadline):
        seen.append(self)
        start(self, deadline)

    monkeypatch.setattr(Deployment, "start", recording_start)
    return seen


# --- Reverse misconfiguration: a frontend that migrates although the policy forbids it --------


@pytest.mark.parametrize("response", ["stream", "unary"])
@pytest.mark.parametrize(
    ("case_id", "expected", "counted"),
    [
        (
            "migration_disabled-worker_failure-chat-{}-tcp",
            ["policy migration_disabled requires an API error after the fault",
             "migration counter succeeded = 1, expected 0",
             "migration counter failed = 0, expected 1"],
            ("succeeded", 1),
        ),
        (
            "max_seq_len_exceeded-worker_failure-completion-{}-tcp",
            ["policy max_seq_len_exceeded requires an API error after the fault",
             "migration counter max_seq_len_exceeded = 0, expected 1"],
            ("max_seq_len_exceeded", 0),
        ),
    ],
    ids=["migration_disabled", "max_seq_len_exceeded"],
)  # fmt: skip
def test_a_frontend_that_migrates_anyway_fails_the_case(
    tmp_path, response, case_id, expected, counted
):
    """Limit on, no cap, where the policy forbids migration or caps it: the response
    completes and the counters say so; the case must fail for exactly that."""
    case = Case.from_id(case_id.format(response))
    result = runner.run_case(
        MockerBackend(), case, tmp_path, SETTINGS, 60,
        frontend_policy=POLICIES["migration_enabled"],
    )  # fmt: skip
    assert not result.verdict.passed
    reasons = " | ".join(result.verdict.reasons)
    for reason in expected:
        assert reason in reasons
    # What the reasons say is what the history holds: a response that ended well, and the
    # counter as read.
    assert events(result, "response_finished")[0]["failed"] is False
    name, value = counted
    assert events(result, "metrics_read")[0]["counts"][name] == value


# --- A migration counted after the reading the verdict used -----------------------------------


def test_a_second_migration_after_the_agreeing_reading_fails_the_case(
    tmp_path, monkeypatch, started
):
    """Three workers: after the counters agreed (one migration), a second request is sent and
    its worker SIGKILLed, so the frontend counts a second migration. The last-moment reading
    must see it."""
    settled = single.settled_counts

    def settled_then_migrate_again(metrics_url, model, before, expected, mode, deadline):
        agreed = settled(metrics_url, model, before, expected, mode, deadline)
        deployment = started[-1]
        shape = deployment.backend.shape(deployment.case, variant=7)
        request = Request("chat", True, model, shape.prompt, shape.max_tokens)
        inflight = InFlight(deployment.base_url, request, read_timeout_s=30)
        alive = [w for w in deployment.workers if w.process.exit_code() is None]
        holder = faults.find_holder(deployment.backend, alive, inflight, Deadline(20))
        holder.process.kill()

        def counted_twice():
            now = MigrationCounts.parse(scrape(metrics_url), model).since(before)
            return (True if now.ongoing_request == 2 else None), str(now)

        poll_until(counted_twice, Deadline(20), "the second migration to be counted")
        return agreed

    monkeypatch.setattr(single, "settled_counts", settled_then_migrate_again)
    case = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")
    result = runner.run_case(
        MockerBackend(), case, tmp_path, SETTINGS, 90, roles=("aggregate",) * 3
    )
    assert not result.verdict.passed
    assert (
        "migration counter ongoing_request moved from 1 to 2 after the reading the verdict used"
        in result.verdict.reasons[0]
    )
    assert events(result, "metrics_read")[0]["counts"]["ongoing_request"] == 1
    assert events(result, "metrics_reread")[0]["counts"]["ongoing_request"] == 2
    assert_nothing_left(result, started)


def test_the_last_moment_reading_passes_an_undisturbed_case(tmp_path):
    case = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, 60)
    assert not result.verdict.reasons, result.verdict.summary()
    assert (
        events(result, "metrics_reread")[0]["counts"] == events(result, "metrics_read")[0]["counts"]
    )


# --- A drain that finishes the request inside the graceful bound ------------------------------


def test_a_graceful_bound_longer_than_the_response_is_a_missed_window(tmp_path):
    """As a user found it: --handoff-graceful-bound 10 would let the drained mocker finish all
    900 tokens and exit on SIGTERM alone. The drain is not sent: the request has less left
    than the bound it must outlast, and the case says so, not proven, never a failure of the
    system nor a worker that was not serving the request."""
    case = Case.from_id("migration_enabled-graceful_shutdown-completion-unary-tcp")
    settings = replace(SETTINGS, graceful_bound_s=10.0)
    result = runner.run_case(MockerBackend(), case, tmp_path, settings, 60)
    assert result.verdict.outcome == NOT_PROVEN and result.verdict.reasons == []
    (missed,) = result.verdict.unproven
    assert missed.startswith("missed window: ") and " s of the request were left before " in (
        missed
    )
    assert "graceful_shutdown, which needs 1" in missed  # the 10 s bound, and the lag measured
    assert not events(result, "fault_sent")


# --- The frontend dies, or stops answering, mid-case ------------------------------------------


@pytest.mark.parametrize(
    ("module", "step", "sig", "said"),
    [
        (faults, "prove_in_flight", signal.SIGKILL, "its process exited with code -9"),
        (recovery, "send_fault", signal.SIGSTOP, "its process is stopped, using 0% of a core"),
    ],
    ids=["killed-once-the-request-is-in-flight", "stopped-right-after-the-fault"],
)
def test_a_frontend_that_dies_or_stops_mid_case_is_named(
    tmp_path, monkeypatch, started, module, step, sig, said
):
    """The frontend is signalled right after a step of the case (by the pid handoff recorded):
    the case ends within its budget, names the frontend, its state and its log."""
    real = getattr(module, step)

    def then_signal_the_frontend(*args, **kwargs):
        done = real(*args, **kwargs)
        os.kill(started[-1].frontend.pid, sig)
        return done

    monkeypatch.setattr(module, step, then_signal_the_frontend)
    case = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, 30)
    assert not result.verdict.passed
    reason = result.verdict.reasons[0]
    assert reason.startswith("the frontend stopped answering mid-case (")
    assert said in reason
    assert str(tmp_path / "frontend.log") in reason
    assert result.seconds < 30 + 15  # the case budget plus the teardown bound
    assert_nothing_left(result, started)


# --- Teardown: a detached child left holding a leased port ------------------------------------


class DetachingMocker(DetachedChild, MockerBackend):
    """The mocker, each of its workers leaving a detached child that holds a leased port."""


def test_a_detached_child_holding_a_leased_port_fails_the_case(tmp_path, handoff_mark):
    case = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")
    try:
        result = runner.run_case(DetachingMocker(), case, tmp_path / "case", SETTINGS, 60)
        strays = strays_under(tmp_path / "case")
        assert len(strays) == 2, strays  # one for each of the two aggregate workers
        # Out of this process's tree (re-parented to init), yet found by the leak check.
        tree = {p.pid for p in psutil.Process().children(recursive=True)}
        assert set(strays.values()) <= {p.pid for p in marked(handoff_mark)} - tree
        assert not result.verdict.passed
        reasons = " | ".join(result.verdict.reasons)
        for port, pid in strays.items():
            assert f"port {port} still bound" in reasons
            assert f"by pid {pid} (" in reasons
        # The next case still gets free ports: a leased port that is bound is never handed out.
        after = runner.run_case(MockerBackend(), case, tmp_path / "next", SETTINGS, 60)
        assert not after.verdict.reasons, after.verdict.summary()
    finally:
        kill_strays(tmp_path)


# --- Start-ups that never finish ---------------------------------------------------------------


class OtherModelPrefill(MockerBackend):
    """The prefill worker serves another model name: the frontend lists it, but the case's
    model never gets a prefill router."""

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        if role != "prefill":
            return launch
        argv = list(launch.argv)
        argv[argv.index("--model-name") + 1] = "another-model"
        return type(launch)(argv, launch.env)


def test_a_prefill_router_that_never_activates_fails_at_start_up(tmp_path, started):
    case = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp", "prefill")
    settings = replace(SETTINGS, startup_timeout_s=20.0)
    result = runner.run_case(OtherModelPrefill(), case, tmp_path, settings, 60)
    assert not result.verdict.passed
    assert result.verdict.phase == "launch"
    first, _, tail = result.verdict.reasons[0].partition("\n")
    assert "its prefill router active" in first
    assert "no 'Prefill router target activated' for 'handoff-mocker' in its log yet" in first
    assert first.endswith(f"log {tmp_path / 'frontend.log'}:")
    assert tail, "the frontend's log tail is missing"
    assert_nothing_left(result, started)


def test_a_frontend_that_exits_during_start_up_fails_with_its_log(tmp_path, started):
    unparsable = Policy("broken", ENABLED_LIMIT, "not-a-number")  # type: ignore[arg-type]
    case = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")
    result = runner.run_case(
        MockerBackend(), case, tmp_path, SETTINGS, 60, frontend_policy=unparsable
    )
    assert not result.verdict.passed
    assert result.verdict.phase == "launch"
    first, _, tail = result.verdict.reasons[0].partition("\n")
    assert first.startswith("frontend exited with code 2 during start-up; log ")
    assert "--migration-max-seq-len" in tail
    assert_nothing_left(result, started)
