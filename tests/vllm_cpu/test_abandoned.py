"""A client that leaves, on an engine that ignores aborts for real (tests/abort_ignoring_engine:
vLLM's engine core drops every abort): Dynamo's handler lets the request go, vLLM's engine
decodes it on for nobody, and the case fails naming the worker whose engine went on, by the
engine's own `vllm:num_requests_running`. The same case on the same workers unpatched passes:
the patch, not the longer output, is what fails it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_engine import SETTINGS, TIMEOUT_S

from handoff.backend import VLLM_RUNNING
from handoff.cases import Case
from handoff.runner import run_case
from handoff_vllm import VllmBackend

HERE = Path(__file__).resolve().parents[1] / "abort_ignoring_engine"
#: The abandoned pre-merge case with a client that leaves mid-stream, nothing else faulted.
LEFT = Case.from_id("client_close-chat-nats", "abandoned")
#: The request's output, in place of the topology's 512 tokens (about 5 s at the 100 tokens a
#: second measured here): an engine that ignores the abort must still be decoding when the harness
#: has waited `abandon.STOP_BOUND_S` (5 s) for it to stop and then `recovery.GAUGE_SETTLE_S` (3 s)
#: for every gauge to fall once the response ended, about 8.5 s after the client left. 4,000 of
#: the 4,096-token context hold that up to about 450 tokens a second; they cost nothing more,
#: as nothing waits for the engine to end the request (teardown kills it).
OUTPUT_TOKENS = 4000


class LongOutput(VllmBackend):
    """The abandoned case's request, long enough to outlast the harness's two readings."""

    def __init__(self, ignore_aborts: bool):
        super().__init__()
        self.ignore_aborts = ignore_aborts

    def shape(self, case, variant=0):
        return replace(super().shape(case, variant), max_tokens=OUTPUT_TOKENS)

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        if not self.ignore_aborts:
            return launch
        path = [p for p in (launch.env.get("PYTHONPATH"), str(HERE)) if p]
        env = {"PYTHONPATH": ":".join(path), "HANDOFF_IGNORE_ABORTS": "1"}
        return replace(launch, env={**launch.env, **env})


@pytest.mark.parametrize("ignore_aborts", [True, False], ids=["ignoring", "control"])
def test_an_engine_that_ignores_aborts_fails_an_abandoned_case_by_name(
    vllm_cpu, tmp_path, ignore_aborts
):
    """Ignoring: the holder's handler ends the request (its in-flight gauge at 0) and its engine
    core, told to abort it, logs that it did not; both the abandon check and the idle check name
    the holder's engine. Control: the same backend without the patch passes."""
    backend = LongOutput(ignore_aborts)
    backend.configure(vllm_cpu.configuration)
    result = run_case(backend, LEFT, tmp_path, SETTINGS, TIMEOUT_S)
    if not ignore_aborts:
        assert result.verdict.passed, result.verdict.summary()
        return
    assert not result.verdict.passed
    holder = next(e.data["worker"] for e in result.history.events if e.name == "holder_found")
    (log,) = tmp_path.rglob(f"{holder}.log")
    assert "handoff-test: ignore_aborts: abort of [" in log.read_text(), "no abort was ignored"
    reason, idle = result.verdict.reasons
    assert reason.startswith(f"{holder} went on with the request after its client left: "), reason
    assert f"timed out waiting for {holder} to stop the request" in reason, reason
    assert reason.endswith(
        f"last seen: 0 in flight by its handler, 1 running in its engine ({VLLM_RUNNING})"
    ), reason
    assert idle.startswith("after every response ended: ") and f"{holder}'s engine" in idle, idle
