"""Tests on the real engine: Dynamo's vLLM workers on vLLM's CPU build (nox -s vllm_cpu_tests).

Every test, pass or fail, must leave no process behind, the engine's own children included: a
SIGKILLed dynamo.vllm's VLLM::EngineCore is re-parented to init, so it is looked for in the
whole machine, among the processes started since the test began. Looking by name only finds
them; handoff never signals by name."""

import time

import psutil
import pytest

#: What handoff's deployments run: Dynamo's processes, vLLM's engine and workers, nats-server.
OURS = ("dynamo.", "VLLM::", "nats-server")


def ours_since(started: float) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "create_time", "status"]):
        info = proc.info
        if info["create_time"] < started or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        command = " ".join(info["cmdline"] or [])
        if any(mark in command for mark in OURS):
            found.append(f"{info['pid']}: {command[:80]}")
    return found


@pytest.fixture(autouse=True)
def nothing_left_running():
    started = time.time()
    yield
    assert ours_since(started) == [], "processes left behind"


@pytest.fixture(scope="session")
def vllm_cpu():
    """The vLLM backend on its CPU device, configured as a team would have it."""
    from handoff.plugins import configured_backend

    return configured_backend("vllm", {"device": ("cpu", "test")})
