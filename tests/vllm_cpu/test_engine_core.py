"""engine_core on the real engine: a Dynamo vLLM worker made to stay up once its engine core is
dead (tests/undying_worker, as Dynamo issues 2698 and 14657 report it) fails the case by name;
the pre-merge cases show the worker as it is, ending by itself."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from test_engine import SETTINGS, TIMEOUT_S, reasons_of

from handoff import faults
from handoff.cases import Case
from handoff.runner import run_case
from handoff_vllm import VllmBackend

HERE = Path(__file__).resolve().parents[1] / "undying_worker"
ENGINE = Case.from_id("migration_enabled-chat-stream-nats", "engine_core")


class Undying(VllmBackend):
    """Workers that neither notice nor act on their engine's death."""

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        path = [p for p in (launch.env.get("PYTHONPATH"), str(HERE)) if p]
        env = {"PYTHONPATH": ":".join(path), "HANDOFF_UNDYING": "1"}
        return replace(launch, env={**launch.env, **env})


def test_a_worker_that_stays_up_without_its_engine_fails_the_case_by_name(vllm_cpu, tmp_path):
    backend = Undying()
    backend.configure(vllm_cpu.configuration)
    result = run_case(backend, ENGINE, tmp_path, SETTINGS, TIMEOUT_S)
    logs = "".join(p.read_text() for p in tmp_path.rglob("worker-*.log"))
    assert "handoff-test: undying: dynamo.vllm.engine_monitor patched" in logs
    reasons = reasons_of(result)
    stayed = rf"worker-\d+-aggregate was still running {faults.ENGINE_EXIT_S:g} s after its engine"
    assert re.search(stayed + r" core \(pid \d+\) was killed", reasons), reasons
