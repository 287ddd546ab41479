"""What every Dynamo worker on a GPU engine shares, whatever the engine: the base class of the
GPU backends. It names no engine; each subclass supplies its engine's module, its worker flags
and its seed markers.

The facts come from Dynamo's own migration tests (Dynamo's tests/fault_tolerance/migration:
test_vllm.py, test_sglang.py, test_trtllm.py), reduced to a 1,024-token context:

- the worker environment (`dynamo_worker_env`): the system port, no canary health checks (they
  send requests of their own that interfere with the one in flight), health from the `generate`
  endpoint, and no shutdown grace period;
- the model, Qwen/Qwen3-0.6B, and the topologies each engine runs: aggregate, decode and
  kv_transfer, with the same roles as the mocker's.

The request (`shape`): a repeated plain sentence, sized so that the prompt and the output fit
the context. `Shape.prompt_tokens` is the prompt as the engine prefills it, counted for the
default model (Qwen3's byte-level BPE: each word of `SENTENCE` and the full stop are one token
each; a chat request adds `CHAT_TEMPLATE_TOKENS` of Qwen3's chat template). It is not checked
against the tokenizer here (no model files are needed to plan a case): it is recorded in
history.json only, and no verdict reads it. What a verdict reads is the output, which the
request fixes exactly (`max_tokens` with `ignore_eos`).

Ports: core leases, for each worker, the names its role uses (`role_ports`, else all of
`worker_ports`), and each of them is on the worker's command line or in its environment.

KV transfer proof: between two workers on one GPU the transfer takes far less than anything a
timing floor could tell apart, so each engine names its own counter of completed transfers on
the decode workers' /metrics (`kv_transfer_counter`); a kv_transfer case fails unless it rose
before the fault.
"""

from __future__ import annotations

import sys
from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from handoff.backend import TIMEOUT_MARKER, Backend, Launch, Model, Shape
from handoff.cases import KILLS, SAMPLINGS, Case, Restriction
from handoff.errors import HandoffError
from handoff.machine.environment import require_engine

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
#: Every worker's context (max model length): the longest prompt plus its output fits it.
CONTEXT_TOKENS = 1024
#: Output tokens per topology; a team's `max_tokens` setting overrides them one by one. 512
#: tokens of decoding outlast a SIGKILL and the 2 s graceful bound on any of the engines.
OUTPUT_TOKENS = {
    "aggregate": 512, "decode": 512, "kv_transfer": 192, "load": 512, "guided": 512,
    "abandoned": 512, "decode_race": 512, "engine_core": 512, "join": 512, "rolling": 512,
    "usage": 512, "stop": 512, "stop_after": 512, "min_tokens": 512,
    **dict.fromkeys(SAMPLINGS, 64),
}  # fmt: skip
#: Prompt tokens per topology as the engine prefills them. kv_transfer: the 823-token KV
#: prefix that the prefill worker hands over (823 + 192 = 1,015 of the 1,024-token context).
#: load, guided, abandoned, decode_race: the aggregate's prompt (vLLM's CPU engine runs them).
PROMPT_TOKENS = {
    "aggregate": 64, "decode": 64, "kv_transfer": 823, "load": 64, "guided": 64, "abandoned": 64,
    "decode_race": 64, "engine_core": 64, "join": 64, "rolling": 64, "usage": 64,
    "stop": 64, "stop_after": 64, "min_tokens": 64, **dict.fromkeys(SAMPLINGS, 64),
}  # fmt: skip
TOPOLOGIES = {
    "aggregate": ("aggregate", "aggregate"),
    "decode": ("prefill", "decode", "decode"),
    "kv_transfer": ("prefill", "decode", "decode"),
}
#: Why a GPU engine's prefill worker cannot be faulted in its window on purpose.
PREFILL_TOO_SHORT = (
    "a fault cannot be timed inside a GPU prefill of a ~1k-token prompt, which takes milliseconds"
)

#: Why a GPU engine does not run the load topology yet.
LOAD_NOT_BUILT = (
    "load cases (many requests at once, some queued) run on the mocker and on vLLM's CPU "
    "engine so far: on a GPU, this engine's batch limit and its queued requests are not "
    "measured yet"
)

#: Why a GPU engine does not run a request that may not move, or a client that leaves, yet.
FIRST_ON_CPUS = (
    "qualified on the mocker and on vLLM's CPU engine so far: on a GPU, this engine's guided "
    "decoding and its cancellation are not measured yet"
)
#: Why no engine but the mocker runs the discovery plane's cases.
DISCOVERY_ON_THE_MOCKER = (
    "the discovery plane is Dynamo's runtime's, the same whatever the engine: qualified on the "
    "mocker"
)
#: The topologies no GPU engine runs yet, each with why.
NOT_BUILT_ON_GPUS = {
    "load": LOAD_NOT_BUILT,
    "decode_load": LOAD_NOT_BUILT,
    "join": LOAD_NOT_BUILT,
    "rolling": LOAD_NOT_BUILT,
    "guided": FIRST_ON_CPUS,
    "choices": FIRST_ON_CPUS,
    "usage": FIRST_ON_CPUS,
    "stop": FIRST_ON_CPUS,
    "stop_after": FIRST_ON_CPUS,
    "min_tokens": FIRST_ON_CPUS,
    **dict.fromkeys(SAMPLINGS, FIRST_ON_CPUS),
    "abandoned": FIRST_ON_CPUS,
    "decode_race": FIRST_ON_CPUS,
    "engine_core": "qualified on vLLM's CPU engine so far: an engine core killed under its "
    "worker on a GPU is not measured yet",
    "discovery": DISCOVERY_ON_THE_MOCKER,
}

#: One token each for Qwen3 (the first word has no leading space; the others do).
SENTENCE = ("This", " is", " a", " test", " of", " the", " system", " and", " it", " is",
            " only", " a", " test", ".")  # fmt: skip
#: What Qwen3's chat template adds around one user message: `<|im_start|>user\n` before it,
#: `<|im_end|>\n<|im_start|>assistant\n` after it (3 + 5 tokens; no system message, no tools).
CHAT_TEMPLATE_TOKENS = 8


def dynamo_worker_env(system_port: int) -> dict[str, str]:
    """The environment of a Dynamo GPU worker, as Dynamo's migration tests set it."""
    return {
        "DYN_SYSTEM_PORT": str(system_port),
        # Canary health checks send requests of their own, which interfere with the test's.
        "DYN_HEALTH_CHECK_ENABLED": "false",
        "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": '["generate"]',
        # A drained worker stops at once: handoff's graceful bound decides when it is killed.
        "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": "0",
    }


def prompt_text(tokens: int, variant: int = 0) -> str:
    """`tokens` words and full stops of `SENTENCE`, repeated from its word number `variant`:
    one token each for Qwen3."""
    pieces = [SENTENCE[(variant + i) % len(SENTENCE)] for i in range(tokens)]
    return "".join(" " + p if i and p == SENTENCE[0] else p for i, p in enumerate(pieces))


class DynamoGpuBackend(Backend):
    """A Dynamo worker on a GPU engine. A subclass sets `name`, `version`, `engine_module`,
    `dynamo_module`, `unsupported`, `worker_ports` (and `role_ports` when a role uses fewer),
    `kv_transfer_counter`,
    `migration_counts`, the seed markers, and gives `engine_argv`: its worker's own flags.

    Seed markers (`timeouts`, `profiled_vram_gib`, `kv_cap`) are Dynamo's suite's values for
    the same engine and model; handoff's profiler is to measure them again for these cases.
    """

    needs_gpu = True
    #: The engine's top-level Python module (checked before a case runs), e.g. "vllm".
    engine_module: ClassVar[str]
    #: The Dynamo worker module, run as `python -m <dynamo_module>`.
    dynamo_module: ClassVar[str]
    topologies: ClassVar[Mapping[str, tuple[str, ...]]] = TOPOLOGIES
    restrictions: ClassVar[tuple[Restriction, ...]] = (
        Restriction(
            "fault",
            KILLS,
            "a stall and an expired drain are qualified on the mocker first; on a GPU engine "
            "their bounds are still to be measured",
        ),
    )
    #: Each word of SENTENCE can start the prompt.
    distinct_prompts = len(SENTENCE)
    #: Requests go out at temperature 0 with seed 0: the same output every time.
    deterministic = True
    #: Per topology: the case timeout (when the team sets no `case_timeout_s`) and the peak GPU
    #: memory of the whole deployment.
    timeouts: ClassVar[Mapping[str, float]] = {}
    profiled_vram_gib: ClassVar[Mapping[str, float]] = {}
    #: The KV cache cap marker, name and value; the same cap is on each worker's command line.
    kv_cap: ClassVar[tuple[str, int]]
    #: Every worker's context (max model length).
    context_tokens: ClassVar[int] = CONTEXT_TOKENS
    #: No `case_timeout_s` default: unless a team sets one, each topology has its own timeout.
    #: Dynamo's suite waits up to 300 s for a GPU worker to load its model and come up.
    defaults: ClassVar[Mapping[str, object]] = {
        "startup_timeout_s": 300.0,
        "model": DEFAULT_MODEL,
        "max_tokens": OUTPUT_TOKENS,
    }

    def check_environment(self) -> None:
        require_engine(self.name, self.engine_module, "dynamo")

    def prepare_model(self, folder: Path) -> Model:
        """The model by name, which workers load from the hub cache (offline); with
        `model_path`, from that folder, still served under the name `model`."""
        name = str(self.setting("model") or DEFAULT_MODEL)
        path = self.setting("model_path")
        if not path:
            return Model(name, None)
        local = Path(str(path)).expanduser()
        if not local.is_dir():
            raise HandoffError(
                f"model_path {local} of the {self.name} backend is not a folder: set it to a "
                f"local copy of {name}, or remove it to load {name} from the hub cache"
            )
        return Model(name, local)

    def shape(self, case: Case, variant: int = 0) -> Shape:
        prompt_tokens = PROMPT_TOKENS[case.topology]
        configured = self.setting("max_tokens") or {}
        max_tokens = int(configured.get(case.topology, OUTPUT_TOKENS[case.topology]))
        context = self.context_tokens
        if prompt_tokens + max_tokens > context:
            raise HandoffError(
                f"max_tokens {max_tokens} for {case.topology} does not fit the "
                f"{context}-token context of the {self.name} workers with the "
                f"{prompt_tokens}-token prompt: set it to {context - prompt_tokens} or less"
            )
        prompt = self.prompt(prompt_tokens, case.api, variant)
        return Shape(prompt, prompt_tokens, max_tokens)

    def prompt(self, tokens: int, api: str, variant: int = 0) -> str:
        """A prompt the engine prefills as `tokens` tokens of the default model (Qwen3), its
        chat template included for a chat request."""
        return prompt_text(tokens - (CHAT_TEMPLATE_TOKENS if api == "chat" else 0), variant)

    def markers(self, case: Case) -> dict[str, float]:
        timeout = self.setting("case_timeout_s") or self.timeouts[case.topology]
        name, cap = self.kv_cap
        return {
            TIMEOUT_MARKER: float(timeout),
            "profiled_vram_gib": self.profiled_vram_gib[case.topology],
            name: cap,
        }

    def worker(
        self, role: str, case: Case, model: Model, ports: Mapping[str, int], folder: Path
    ) -> Launch:
        argv = [
            sys.executable, "-m", self.dynamo_module,
            "--request-plane", case.plane,
            *self.engine_argv(role, model, ports, folder),
        ]  # fmt: skip
        # No hub variable from `model_cache`: that setting is a host folder, which the runtime
        # container mounts as its HF_HOME (handoff.commands.container); the workers inherit HF_HOME
        # (or the shell's own hub variables, outside a container) with the runtime env.
        env = {**dynamo_worker_env(ports["system"]), **self.engine_env(role, ports)}
        return Launch(argv, env, self.worker_niceness)

    @abstractmethod
    def engine_argv(
        self, role: str, model: Model, ports: Mapping[str, int], folder: Path
    ) -> list[str]:
        """The engine's part of the worker's command line for `role`."""

    def engine_env(self, role: str, ports: Mapping[str, int]) -> dict[str, str]:
        """Environment the engine needs on top of the Dynamo worker's; none by default."""
        return {}

    @property
    def worker_niceness(self) -> int:
        """How far the workers yield the CPU to the harness and the frontend; on a GPU they
        do not need to."""
        return 0

    @staticmethod
    def model_source(model: Model) -> str:
        """What a worker loads: the local folder when there is one, else the hub name."""
        return str(model.path) if model.path is not None else model.name
