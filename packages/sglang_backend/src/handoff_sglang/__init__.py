"""handoff backend: Dynamo with SGLang workers (`python -m dynamo.sglang`).

Launch facts from Dynamo's tests/fault_tolerance/migration/test_sglang.py, reduced to a
1,024-token context; what every Dynamo GPU worker shares is in `handoff.gpu_backend`.

KV cap: `--max-total-tokens 1024`, a fixed size of SGLang's KV pool (not a fraction of free
memory): one full-context request, the most a worker ever holds (`--max-running-requests 1`).

Prefix caching off (`--disable-radix-cache`; SGLang's radix cache is on by default): each request
is computed whole, so a request the deployment served before never serves a case's prefill
from cache, and a decode worker always pulls its KV from the prefill worker.

Ports: `system` (Dynamo's status server) and `nccl` (`--nccl-port`, the engine's process group
rendezvous) for every role; `bootstrap` (`--disaggregation-bootstrap-port`) for the
disaggregated roles, which find each other through it; `http` (`--port`) for prefill workers
only, as in Dynamo's suite. An aggregate worker runs no disaggregation and no server port.

Migration counts are checked as a lower bound, as Dynamo's suite checks them (that a
migration happened, not how many).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path

from handoff.backend import Model
from handoff.gpu_backend import (
    CONTEXT_TOKENS,
    NOT_BUILT_ON_GPUS,
    PREFILL_TOO_SHORT,
    DynamoGpuBackend,
)
from handoff.machine.services import LOOPBACK
from handoff.plugins import hookimpl

KV_TOKENS = 1024
PAGE_TOKENS = 16


class SglangBackend(DynamoGpuBackend):
    name = "sglang"
    sessions = {"": "sglang_pre_merge"}
    version = version("handoff-sglang")
    engine_module = "sglang"
    dynamo_module = "dynamo.sglang"
    unsupported = {
        "prefill": "Dynamo's own SGLang prefill migration tests are N/A (skipped), and "
        + PREFILL_TOO_SHORT,
        **NOT_BUILT_ON_GPUS,
    }
    worker_ports = ("system", "nccl", "bootstrap", "http")
    role_ports = {
        "aggregate": ("system", "nccl"),
        "prefill": ("system", "nccl", "bootstrap", "http"),
        "decode": ("system", "nccl", "bootstrap"),
    }
    migration_counts = "lower_bound"
    #: Completed KV transfers, exported with --enable-metrics (as Dynamo's suite reads them).
    kv_transfer_counter = "sglang:kv_transfer_total_mb_count"
    # Seeds from Dynamo's suite, to be profiled again with handoff's profiler. 780 s is its
    # last-resort ceiling; the 3-worker VRAM is the aggregate 5.4 GiB scaled by 3/2.
    timeouts = {"aggregate": 780.0, "decode": 780.0, "kv_transfer": 780.0}
    profiled_vram_gib = {"aggregate": 5.4, "decode": 8.1, "kv_transfer": 8.1}
    kv_cap = ("requested_sglang_kv_tokens", KV_TOKENS)

    def engine_argv(
        self, role: str, model: Model, ports: Mapping[str, int], folder: Path
    ) -> list[str]:
        argv = [
            "--model-path", self.model_source(model),
            "--served-model-name", model.name,
            "--page-size", str(PAGE_TOKENS),
            "--tp", "1",
            "--nccl-port", str(ports["nccl"]),
            "--disable-cuda-graph",
            "--max-running-requests", "1",
            "--max-total-tokens", str(KV_TOKENS),
            "--context-length", str(CONTEXT_TOKENS),
            "--disable-radix-cache",
        ]  # fmt: skip
        if role == "aggregate":
            return [*argv, "--skip-tokenizer-init"]
        argv += [
            "--disaggregation-mode", role,
            "--disaggregation-bootstrap-port", str(ports["bootstrap"]),
            "--host", LOOPBACK,
            "--disaggregation-transfer-backend", "nixl",
            "--enable-metrics",  # the KV transfer counter
        ]  # fmt: skip
        if role == "prefill":
            argv += ["--port", str(ports["http"])]
        return argv


@hookimpl
def register_backends(register) -> None:
    register(SglangBackend())
