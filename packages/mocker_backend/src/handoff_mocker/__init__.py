"""handoff's embedded default: Dynamo's real frontend with its CPU `mocker` engine.

The mocker simulates timing, not weights: a token takes about 5.8 ms at speedup ratio 1, and a
KV transfer takes prompt tokens x KV bytes per token / the simulated bandwidth. The shapes and
speeds below are chosen so that each case's request outlasts its fault: the 2 s graceful bound
plus a margin of about a second.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import ClassVar

import requests

from handoff.backend import Backend, Launch, Model, Shape, Worker
from handoff.cases import Case
from handoff.errors import HandoffError
from handoff.hookspecs import hookimpl
from handoff.metrics import sample_sum
from handoff_mocker.model import write_model

MODEL_NAME = "handoff-mocker"
SPEEDUP_RATIO = 1.0
INFLIGHT = "dynamo_component_inflight_requests"
#: Passed explicitly so the simulated transfer time is known, not derived from config.json.
KV_BYTES_PER_TOKEN = 512
GB = 1e9

#: kv_transfer: the seed's 823-token prefix in a 1,024-token context with a 192-token output.
#: The transfer takes about 0.42 s (against ~0.02 s of prefill alone); decode at 0.4x makes
#: the 192 tokens last 2.8 s, longer than the graceful bound.
KV_PREFIX_TOKENS = 823
KV_CONTEXT = 1024
KV_OUTPUT = 192
KV_BANDWIDTH_GBPS = 0.001
KV_DECODE_SPEEDUP = 0.4
#: prefill: the fault must land before the first token, and a graceful fault's bound must
#: pass while the prefill worker still holds the request: its transfer lasts about 3 s.
PREFILL_PROMPT_TOKENS = 823
PREFILL_BANDWIDTH_GBPS = 0.00014
PREFILL_OUTPUT = 64
#: Simulated transfer bandwidth of prefill workers; elsewhere 0, which turns the delay off.
BANDWIDTH_GBPS = {"kv_transfer": KV_BANDWIDTH_GBPS, "prefill": PREFILL_BANDWIDTH_GBPS}
#: aggregate and decode: 512 tokens last about 3 s, so the graceful bound passes mid-stream.
PROMPT_TOKENS = 32
OUTPUT = 512


def prompt(tokens: int) -> str:
    """Words of the mocker model's vocabulary: exactly one token each, no template tokens."""
    return " ".join(f"t{100 + i % 900}" for i in range(tokens))


class MockerBackend(Backend):
    name = "mocker"
    version = version("handoff-mocker")
    topologies: ClassVar[dict[str, tuple[str, ...]]] = {
        "aggregate": ("aggregate", "aggregate"),
        "decode": ("prefill", "decode", "decode"),
        "kv_transfer": ("prefill", "decode", "decode"),
        "prefill": ("prefill", "prefill", "decode"),
    }
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

    def shape(self, case: Case) -> Shape:
        tokens, output = {
            "kv_transfer": (KV_PREFIX_TOKENS, KV_OUTPUT),
            "prefill": (PREFILL_PROMPT_TOKENS, PREFILL_OUTPUT),
        }.get(case.topology, (PROMPT_TOKENS, OUTPUT))
        return Shape(prompt(tokens), tokens, output)

    def worker(self, role: str, case: Case, model: Model, ports: Mapping[str, int]) -> Launch:
        argv = [
            sys.executable, "-m", "dynamo.mocker",
            "--model-path", str(model.path),
            "--model-name", model.name,
            "--discovery-backend", "file",
            "--request-plane", case.plane,
            "--speedup-ratio", str(self.speedup_ratio),
            "--disaggregation-mode", {"aggregate": "agg"}.get(role, role),
            "--kv-bytes-per-token", str(KV_BYTES_PER_TOKEN),
        ]  # fmt: skip
        if case.topology == "kv_transfer":
            argv += ["--max-model-len", str(KV_CONTEXT)]
            if role == "decode":
                argv += ["--decode-speedup-ratio", str(KV_DECODE_SPEEDUP)]
        if role == "prefill":
            argv += ["--kv-transfer-bandwidth", str(BANDWIDTH_GBPS.get(case.topology, 0))]
        return Launch(argv, {"DYN_SYSTEM_PORT": str(ports["system"])})

    def holders(self, workers: Sequence[Worker]) -> list[Worker]:
        """Workers whose own /metrics report a generate request in flight."""
        return [w for w in workers if _inflight(w.ports["system"]) > 0]

    def kv_transfer_floor_s(self, case: Case) -> float | None:
        bandwidth = BANDWIDTH_GBPS.get(case.topology)
        if bandwidth is None:
            return None
        return self.shape(case).prompt_tokens * KV_BYTES_PER_TOKEN / (bandwidth * GB)


def _inflight(system_port: int) -> float:
    try:
        text = requests.get(f"http://127.0.0.1:{system_port}/metrics", timeout=2).text
    except requests.RequestException:
        return 0.0  # a worker that cannot answer holds nothing we could fault
    return sample_sum(text, INFLIGHT, {"dynamo_endpoint": "generate"})


@hookimpl
def register_backends(register) -> None:
    register(MockerBackend())
