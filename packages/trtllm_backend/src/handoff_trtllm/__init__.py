"""handoff backend: Dynamo with TensorRT-LLM workers (`python -m dynamo.trtllm`).

Launch facts from Dynamo's tests/fault_tolerance/migration/test_trtllm.py, reduced to a
1,024-token context; what every Dynamo GPU worker shares is in `handoff.gpu_backend`.

KV cap: `kv_cache_config.max_tokens: 4096` in the worker's extra engine args (a YAML file in the
case folder, one per worker, named by role and system port), a fixed size rather than a
fraction of free memory. `--free-gpu-memory-fraction 0.15` bounds it from above as in Dynamo's
suite; the file repeats that fraction in its `kv_cache_config`, because the file's table takes
the place of the one Dynamo builds from the flag. The disaggregated roles also get the cache
transceiver (for the KV transfer) and no overlap scheduler, as in Dynamo's suite.

Prefix caching off: `kv_cache_config.enable_block_reuse: false` (TRT-LLM reuses KV blocks by
default; Dynamo 1.6.1's worker has no flag of its own for it and reads it from this file, only
warning that no reuse events are published, which round-robin routing does not use): each
request is computed whole, so a request the deployment served before never serves a case's
prefill from cache, and a decode worker always pulls its KV from the prefill worker.

Ports: only `system`; the worker's command line takes no other port.

Migration counts are checked as a lower bound, as Dynamo's suite checks them (that a migration
happened, not how many).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path

from handoff.backend import Model
from handoff.cases import Restriction
from handoff.gpu_backend import CONTEXT_TOKENS, NOT_BUILT_ON_GPUS, DynamoGpuBackend
from handoff.plugins import hookimpl

KV_TOKENS = 4096
FREE_GPU_MEMORY_FRACTION = 0.15
#: Dynamo's names of the roles.
MODES = {"aggregate": "agg", "prefill": "prefill", "decode": "decode"}


def engine_config(role: str) -> dict[str, object]:
    """The extra engine args of a worker in `role`."""
    config: dict[str, object] = {}
    if role != "aggregate":
        config["cache_transceiver_config"] = {
            "backend": "DEFAULT",
            "max_tokens_in_buffer": CONTEXT_TOKENS,
        }
        config["disable_overlap_scheduler"] = True
    config["kv_cache_config"] = {
        "max_tokens": KV_TOKENS,
        "free_gpu_memory_fraction": FREE_GPU_MEMORY_FRACTION,
        "enable_block_reuse": False,
    }
    return config


def to_yaml(config: Mapping[str, object]) -> str:
    """One `key: value` line per key, each value in flow style (JSON is valid YAML)."""
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in config.items())


class TrtllmBackend(DynamoGpuBackend):
    name = "trtllm"
    sessions = {"": "trtllm_pre_merge"}
    version = version("handoff-trtllm")
    engine_module = "tensorrt_llm"
    dynamo_module = "dynamo.trtllm"
    unsupported = {
        "prefill": "migration out of a TRT-LLM prefill worker is unsupported: Dynamo's own "
        "prefill migration test is an xfail that timed out",
        **NOT_BUILT_ON_GPUS,
    }
    restrictions = (
        Restriction(
            "fault",
            ("worker_failure",),
            "TRT-LLM's graceful shutdown does not yet give a retryable error, so the frontend "
            "cannot migrate a drained request",
        ),
    )
    worker_ports = ("system",)
    migration_counts = "lower_bound"
    #: Completed KV transfers of a decode worker, exported with --publish-metrics (as Dynamo's
    #: suite reads them on the replacement decode worker).
    kv_transfer_counter = "trtllm_kv_transfer_success_total"
    # Seeds from Dynamo's suite, to be profiled again with handoff's profiler; the 3-worker
    # VRAM is the aggregate 7.2 GiB scaled by 3/2.
    timeouts = {"aggregate": 290.0, "decode": 350.0, "kv_transfer": 350.0}
    profiled_vram_gib = {"aggregate": 7.2, "decode": 10.8, "kv_transfer": 10.8}
    kv_cap = ("requested_trtllm_kv_tokens", KV_TOKENS)

    def engine_argv(
        self, role: str, model: Model, ports: Mapping[str, int], folder: Path
    ) -> list[str]:
        config = folder / f"trtllm-{role}-{ports['system']}.yaml"
        folder.mkdir(parents=True, exist_ok=True)
        config.write_text(to_yaml(engine_config(role)))
        argv = [
            "--model", self.model_source(model),
            "--served-model-name", model.name,
            "--disaggregation-mode", MODES[role],
            "--max-seq-len", str(CONTEXT_TOKENS),
            "--max-num-tokens", str(CONTEXT_TOKENS),
            "--free-gpu-memory-fraction", str(FREE_GPU_MEMORY_FRACTION),
            "--extra-engine-args", str(config),
        ]  # fmt: skip
        return [*argv, "--publish-metrics"] if role == "decode" else argv  # transfer counter


@hookimpl
def register_backends(register) -> None:
    register(TrtllmBackend())
