"""Dynamo caps a runtime's blocking threads at the number of cores. With every process pinned
to one core, on the NATS plane with a prefill router, the deployment never became ready (the
frontend did not answer HTTP): handoff gives every Dynamo process tokio's own cap
(services.RUNTIME_THREADS). Both halves run against the real frontend and mocker workers."""

from __future__ import annotations

import os

import pytest

from handoff.cases import Case
from handoff.deployment import Deployment
from handoff.machine import services
from handoff.machine.polling import Deadline
from handoff.policies import policy
from handoff.pool import StartupFailure
from handoff_mocker import MockerBackend

CASE = Case.from_id("migration_enabled-worker_failure-chat-stream-nats", "decode")
#: The mocker's decode deployment is ready in about a second on one core; a deadlocked one never.
READY_BOUND_S = 6.0


@pytest.fixture(autouse=True)
def one_core():
    """This process and every process it starts (they inherit it) run on one core, so Dynamo
    sizes its runtimes for one."""
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    yield
    os.sched_setaffinity(0, cores)


def start(tmp_path) -> None:
    backend = MockerBackend()
    deployment = Deployment(
        backend, CASE, tmp_path, policy(CASE.policy), backend.roles(CASE.topology)
    )
    try:
        deployment.start(Deadline(READY_BOUND_S))
    finally:
        assert deployment.stop() == []


def test_on_one_core_the_deployment_starts_with_handoff_s_blocking_threads(tmp_path):
    start(tmp_path)
    assert (
        "num_worker_threads=1, max_blocking_threads=512" in (tmp_path / "frontend.log").read_text()
    )


def test_with_dynamo_s_cap_it_never_answers(tmp_path, monkeypatch):
    monkeypatch.setattr(services, "RUNTIME_THREADS", {})
    with pytest.raises(StartupFailure, match=r"last seen: frontend not answering \(ReadTimeout\)"):
        start(tmp_path)
    assert "num_worker_threads=1, max_blocking_threads=1" in (tmp_path / "frontend.log").read_text()
