"""handoff's embedded default: Dynamo's real frontend with its CPU `mocker` engine."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path

import requests

from handoff.backend import Backend, Launch, Model, Worker
from handoff.errors import HandoffError
from handoff.hookspecs import hookimpl
from handoff.metrics import sample_sum
from handoff_mocker.model import write_model

MODEL_NAME = "handoff-mocker"
#: 1.0 streams about 170 tokens a second on one core: an 800-token output outlasts the 2 s
#: graceful bound, and a case still finishes in seconds.
SPEEDUP_RATIO = 1.0
INFLIGHT = "dynamo_component_inflight_requests"


class MockerBackend(Backend):
    name = "mocker"
    version = version("handoff-mocker")
    topologies = ("aggregate",)
    worker_ports = ("system",)
    migration_counts = "exact"
    case_timeout_s = 90.0

    def __init__(self, speedup_ratio: float = SPEEDUP_RATIO) -> None:
        self.speedup_ratio = speedup_ratio

    def check_environment(self) -> None:
        if importlib.util.find_spec("dynamo") is None:
            raise HandoffError(
                "Dynamo is not installed in this environment: run `nox -s mocker_pre_merge`, "
                "which installs it, or see the README for the manual install"
            )

    def prepare_model(self, folder: Path) -> Model:
        write_model(folder)
        return Model(MODEL_NAME, folder)

    def worker(self, role: str, model: Model, plane: str, ports: Mapping[str, int]) -> Launch:
        argv = [
            sys.executable,
            "-m",
            "dynamo.mocker",
            "--model-path",
            str(model.path),
            "--model-name",
            model.name,
            "--discovery-backend",
            "file",
            "--request-plane",
            plane,
            "--speedup-ratio",
            str(self.speedup_ratio),
            "--disaggregation-mode",
            {"aggregate": "agg"}.get(role, role),
        ]
        return Launch(argv, {"DYN_SYSTEM_PORT": str(ports["system"])})

    def holders(self, workers: Sequence[Worker]) -> list[Worker]:
        """Workers whose own /metrics report a generate request in flight."""
        return [w for w in workers if _inflight(w.ports["system"]) > 0]


def _inflight(system_port: int) -> float:
    try:
        text = requests.get(f"http://127.0.0.1:{system_port}/metrics", timeout=2).text
    except requests.RequestException:
        return 0.0  # a worker that cannot answer holds nothing we could fault
    return sample_sum(text, INFLIGHT, {"dynamo_endpoint": "generate"})


@hookimpl
def register_backends(register) -> None:
    register(MockerBackend())
