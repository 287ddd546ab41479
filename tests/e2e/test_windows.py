"""A fault that reaches its request only after the request has ended is the harness's miss: the
case is not proven, a missed window, never a failure of the system; a response the system ends
before any fault is the system's failure, named so. On Dynamo's real frontend and mocker."""

import os
import signal

import pytest
from injections import replace_lifecycle

from handoff import faults, lifecycle, runner
from handoff.cases import Case
from handoff.machine.polling import Deadline, poll_until
from handoff.responses import recovery
from handoff.runner import Settings
from handoff.verdict import FAILED, NOT_PROVEN
from handoff_mocker import MockerBackend

SETTINGS = Settings(keep_logs=True)
TIMEOUT_S = 90


@pytest.mark.parametrize(
    ("case_id", "topology"),
    [
        ("migration_enabled-worker_failure-chat-stream-tcp", "aggregate"),
        ("migration_enabled-worker_stall-completion-unary-tcp", "aggregate"),
        ("migration_disabled-graceful_shutdown-completion-unary-nats", "prefill"),
        ("migration_enabled-partition-chat-nats", "load"),
    ],
)
def test_a_fault_held_back_until_its_request_ended_is_a_missed_window(
    case_id, topology, tmp_path, monkeypatch
):
    """The harness sends the fault only once the request it aims at has ended (every request
    of the faulted worker, in a load case, once one has): each lifecycle, a kill, a stall, a
    drain of a prefill worker and a cut under load, says so, with its timeline."""
    send = recovery.send_fault

    def held_back(run, holder, watched, *args, **kwargs):
        poll_until(
            lambda: (True if watched.finished else None, "open"),
            Deadline(60),
            "the request to end before its fault",
        )
        return send(run, holder, watched, *args, **kwargs)

    monkeypatch.setattr(recovery, "send_fault", held_back)
    case = Case.from_id(case_id, topology)
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, TIMEOUT_S)
    verdict = result.verdict
    assert verdict.outcome == NOT_PROVEN, verdict.summary()
    assert verdict.reasons == [] and not verdict.upstream_defect
    (missed,) = verdict.unproven
    assert missed.startswith("missed window: "), missed
    assert "ended complete" in missed or "token(s) were out" in missed, missed


def signalled_when_found(sig: signal.Signals, monkeypatch) -> None:
    """The holder gets `sig` from outside the harness the moment the harness finds it: the
    system's own doing (a crash, a hang), before any fault of the harness's."""
    find = faults.find_holder

    def signalling(*args, **kwargs):
        holder = find(*args, **kwargs)
        os.kill(holder.process.pid, sig)
        return holder

    monkeypatch.setattr(faults, "find_holder", signalling)


def test_a_worker_that_dies_by_itself_before_any_fault_fails_the_case(tmp_path, monkeypatch):
    """The holder dies on its own (SIGKILLed from outside the harness, as a crash would) the
    moment it is found, before the fault: migration off, the system ends the stream with its
    error. That is the system's failure, named so: never a missed window."""
    signalled_when_found(signal.SIGKILL, monkeypatch)
    case = Case.from_id("migration_disabled-worker_failure-chat-stream-tcp", "aggregate")
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, TIMEOUT_S)
    verdict = result.verdict
    assert verdict.outcome == FAILED and verdict.unproven == [], verdict.summary()
    (reason,) = verdict.reasons
    assert reason.startswith("the system ended the response "), reason
    assert reason.count("before any fault reached it") == 1, reason


def test_a_holder_that_never_streams_is_named_at_the_proofs_bound(tmp_path, monkeypatch):
    """The holder stops (SIGSTOP, from outside the harness) the moment it is found: no token
    ever comes. The case fails once the proof's bound, computed from the mocker's own speed,
    has passed, naming what it waited for, long before the case's deadline."""
    signalled_when_found(signal.SIGSTOP, monkeypatch)
    case = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp", "aggregate")
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, TIMEOUT_S)
    (reason,) = result.verdict.reasons
    assert reason.startswith("timed out waiting for 5 streamed content chunks; last seen: ")
    events = {e.name: e for e in result.history.events}
    bound_s = events["holder_found"].data["proof_s"]
    waited_s = events["failure_found"].at - events["holder_found"].at
    assert bound_s < TIMEOUT_S / 4 and bound_s - 1 <= waited_s < bound_s + 10


def test_a_worker_that_serves_on_past_its_drain_fails_not_missed(tmp_path, monkeypatch):
    """The drained worker is given a 30 s drain timeout instead of the case's 1 s: it finishes
    the request it holds, complete, with no move counted. The drain was sent with its room (the
    request had more left than the drain's wait), so that is the system's failure, named so,
    never a missed window."""
    tag, env = lifecycle.of("drain_expired").worker_env
    long_drain = {**env, "DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS": "30"}
    replace_lifecycle(monkeypatch, "drain_expired", worker_env=(f"{tag}-long", long_drain))
    case = Case.from_id("migration_enabled-drain_expired-chat-stream-nats", "aggregate")
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, TIMEOUT_S)
    verdict = result.verdict
    assert verdict.outcome == FAILED and verdict.unproven == [], verdict.summary()
    assert any(r.endswith("served it on past its drain") for r in verdict.reasons), verdict.reasons
