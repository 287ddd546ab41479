"""Dynamo's frontend caps its blocking threads at the number of cores. On the NATS plane with a
prefill router, a frontend with one worker thread and one blocking thread (Dynamo's defaults
on a one-core machine) never answers HTTP: handoff starts every frontend with tokio's own cap
(services.FRONTEND_ENV). Both halves run against the real frontend and mocker workers."""

from __future__ import annotations

import pytest

from handoff.cases import Case
from handoff.deployment import Deployment
from handoff.machine import services
from handoff.policies import policy
from handoff.polling import Deadline
from handoff.pool import StartupFailure
from handoff_mocker import MockerBackend

CASE = Case.from_id("migration_enabled-worker_failure-chat-stream-nats", "decode")
#: Dynamo's own choice on a one-core machine: a thread of each kind per core.
ONE_CORE = {"DYN_RUNTIME_NUM_WORKER_THREADS": "1", "DYN_RUNTIME_MAX_BLOCKING_THREADS": "1"}
#: The mocker's decode deployment is ready in about a second; a deadlocked one never is.
READY_BOUND_S = 10.0


@pytest.fixture(autouse=True)
def one_core(monkeypatch):
    """Every process of the deployment gets Dynamo's one-core thread counts; the frontend's
    own variables (services.FRONTEND_ENV) come on top."""
    runtime_env = services.runtime_env
    monkeypatch.setattr(services, "runtime_env", lambda *args: {**runtime_env(*args), **ONE_CORE})


def start(tmp_path) -> None:
    backend = MockerBackend()
    deployment = Deployment(
        backend, CASE, tmp_path, policy(CASE.policy), backend.roles(CASE.topology)
    )
    try:
        deployment.start(Deadline(READY_BOUND_S))
    finally:
        assert deployment.stop() == []


def test_a_one_core_frontend_starts_with_handoff_s_blocking_threads(tmp_path):
    start(tmp_path)


def test_with_dynamo_s_one_core_cap_it_never_answers(tmp_path, monkeypatch):
    monkeypatch.setattr(services, "FRONTEND_ENV", {})
    with pytest.raises(StartupFailure, match=r"last seen: frontend not answering \(ReadTimeout\)"):
        start(tmp_path)
