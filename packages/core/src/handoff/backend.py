"""The contract a backend plugin fulfils: facts about one inference engine, no orchestration."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from handoff.client import Annotations, Guide, Sampling
from handoff.errors import HandoffError
from handoff.metrics import worker_sums
from handoff.policies import race_trials
from handoff.sequences import Origin
from handoff.settings import BUILT_IN, Configuration, Setting

if TYPE_CHECKING:
    from handoff.cases import Case, Restriction
    from handoff.machine.processes import ManagedProcess

#: Dynamo's runtime exports this on every worker's system port, whatever the engine.
INFLIGHT = "dynamo_component_inflight_requests"
#: vLLM's own gauge of the requests its engine is running, which Dynamo passes through on the
#: worker's system port; Dynamo's mocker exports it under the same name.
VLLM_RUNNING = "vllm:num_requests_running"
#: The default guides (`Backend.guide`): an object of one string, and words.
OBJECT_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}
WORDS_REGEX = r"( ?[a-z0-9]+)+"
#: The pytest marker that carries a case's deadline in seconds. Not `timeout`: pytest-timeout
#: reads that one and would kill the test mid-teardown, leaving the case's processes running.
TIMEOUT_MARKER = "handoff_timeout"


@dataclass(frozen=True)
class Model:
    """What every process of a deployment serves: the name clients ask for and where it lives.

    `path` None: the workers load the model by name and register it, and the frontend learns it
    from their registration (it gets only `--model-name`).
    """

    name: str
    path: Path | None


@dataclass(frozen=True)
class Launch:
    """A worker's command line, the environment it needs on top of the runtime's, and how far
    it yields the CPU to the harness and the frontend (a `nice` increment, 0 for none)."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    niceness: int = 0


@dataclass(frozen=True)
class Shape:
    """The request of a case: a prompt of a known token length, a fixed output length, the
    guide its output must keep, if any, and what the request tells the engine beside."""

    prompt: str
    prompt_tokens: int
    max_tokens: int
    guide: Guide | None = None
    annotations: Annotations | None = None
    #: How its tokens are chosen, where not the model's best (the sampling topologies).
    sampling: Sampling | None = None


#: Judges a response's top log-probabilities, token by token, given its text: where they first
#: depart, or None.
LogprobJudge = Callable[[list[dict[str, float]], str], str | None]


@dataclass(frozen=True)
class Worker:
    """A started worker: its role, its process and the ports handoff allocated for it."""

    name: str
    role: str
    process: ManagedProcess
    ports: Mapping[str, int]
    #: The title of its engine's core process, where that runs apart (`Backend.engine_core`).
    engine_core: str | None = None


class Backend(ABC):
    """One inference engine as handoff sees it. Subclass it and register an instance.

    Class attributes are the facts core reads:
    - `name` (the `--handoff-backend` value) and `version`;
    - `topologies`: for each supported topology, the roles of its workers in launch order;
    - `unsupported`: for each topology it does not run, why (shown by `handoff cases`);
    - `worker_ports`: names of the ports each worker needs (core leases them on loopback;
      `role_ports` narrows them per role);
    - `restrictions`: axis values the engine cannot run in any topology, each with why; those
      rows are not generated (and `handoff cases` says why);
    - `migration_counts`: "exact" when the frontend's migration counters must equal the
      expectation, "lower_bound" when the engine may legitimately migrate more than once;
    - `defaults`: default settings, overridable by a team's [tool.handoff] and the command
      line; `case_timeout_s` (the timeout marker) and `startup_timeout_s` at least;
    - `devices`: where a backend that offers more than one place to run its workers can run
      them, each with what runs there; the `device` setting picks one.
    """

    name: str
    version: str
    topologies: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    unsupported: ClassVar[Mapping[str, str]] = {}
    restrictions: ClassVar[tuple[Restriction, ...]] = ()
    worker_ports: tuple[str, ...] = ("system",)
    #: The `worker_ports` names a role's worker uses, where it uses fewer than all of them.
    role_ports: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: Same request, same output (temperature 0, fixed seed): the migrated text is compared
    #: with an undisturbed baseline of the same request.
    deterministic: ClassVar[bool] = False
    #: Every streamed frame holds exactly one token (an engine that never coalesces tokens).
    one_token_per_frame: ClassVar[bool] = False
    #: The engine decodes guided output (structured output): a response that completes is
    #: checked against its guide. The mocker accepts a guide and ignores it.
    decodes_guides: ClassVar[bool] = False
    #: A worker's first request may take longer than a case's stream timeout (its start's
    #: lazy work, a KV transfer's handshake): each worker is served one through a frontend
    #: without the case's settings before the case's frontend starts (`Deployment._warm`).
    slow_first_request: ClassVar[bool] = False
    #: A request re-issued to the prefill worker waits for the one its cut-off decode worker
    #: lost to end (Dynamo 1.6.1 with vLLM: docs/known-issues.md): a decode worker is then cut
    #: off in its response's last seconds (`responses.single.cut_late`), but in the race case.
    reissue_waits_for_lost_request: ClassVar[bool] = False
    #: Why not, for the verdict's note, when `deterministic` is False.
    nondeterministic_because: ClassVar[str] = "its output is not deterministic"
    #: A counter of completed KV transfers that decode workers export on their system port:
    #: a kv_transfer case proves its transfer by it when the backend knows no transfer time.
    kv_transfer_counter: ClassVar[str | None] = None
    #: A gauge of the requests the engine itself is running, on each worker's system port
    #: (`engine_running`): the engine's own word that it stopped a request whose client left,
    #: where the handler's in-flight gauge speaks only for Dynamo's side. None: it has none.
    engine_running_gauge: ClassVar[str | None] = None
    #: Fault lifecycles of the backend's own (registered by a plugin through the
    #: `handoff.lifecycles` entry point), by name: its cases add them wherever a worker may be
    #: killed (`cases.allowed`), and run them through the same exercise.
    lifecycles: ClassVar[tuple[str, ...]] = ()
    #: The process title of the engine's core where it runs as a child process of the worker
    #: (vLLM's `VLLM::EngineCore`): the engine_core cases kill it alone. None: no such process.
    engine_core: ClassVar[str | None] = None
    #: The modules its workers run (`python -m`) -> the module whose import is most of their
    #: start: a pool forks such workers from an interpreter that imported it once
    #: (`handoff.machine.preload`). Only for a module that is safe to fork after its import (no
    #: thread, no connection, no device opened by importing it).
    preloaded: ClassVar[Mapping[str, str]] = {}
    migration_counts: Literal["exact", "lower_bound"] = "exact"
    #: The CPUs one case keeps busy on average: cases share the machine's CPU slots by it.
    cpus_per_case: ClassVar[float] = 1.0
    #: Whether its workers need a GPU: the runtime container asks for GPUs (and checks the
    #: host has one) only then.
    needs_gpu: bool = False
    #: How many prompt variants `shape` gives that start differently: the cases one pool of
    #: workers may serve before it is replaced (1: a pool per case).
    distinct_prompts: ClassVar[int] = 1
    defaults: ClassVar[Mapping[str, object]] = {"case_timeout_s": 120.0, "startup_timeout_s": 60.0}
    #: The settings keys this backend reads; a team setting any other for it is an error.
    uses_settings: ClassVar[tuple[str, ...]] = (
        "model", "model_path", "model_cache", "image", "max_tokens",
        "graceful_bound_s", "stream_timeout_s", "case_timeout_s", "startup_timeout_s",
        "fresh_deployments", "spare_workers", "discovery", "durations_file",
    )  # fmt: skip
    #: Dynamo's modules this backend launches from its own interpreter -> the flags it passes
    #: them: the installed release is checked against its entry at start (handoff.releases).
    #: Empty where Dynamo runs elsewhere (inside a runtime image).
    release_modules: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: Device -> what runs there, the default first; empty for a backend with one device.
    devices: ClassVar[Mapping[str, str]] = {}
    #: Device ("" for a backend with one) -> the nox session that runs its cases: its pre-merge
    #: selection, another with `-- --handoff-selection NAME` (`handoff cases` says so). Never
    #: inherited: a session runs the backend it names, not a subclass of it.
    sessions: ClassVar[Mapping[str, str]] = {}
    #: Device -> the defaults that differ there from `defaults` (a team's settings still win).
    device_defaults: ClassVar[Mapping[str, Mapping[str, object]]] = {}
    configuration: Configuration | None = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "sessions" not in cls.__dict__:
            cls.sessions = {}

    def configure(self, configuration: Configuration) -> None:
        """Adopt the effective settings (resolved by core) before any case runs, with the
        chosen device's own defaults in place of the backend's."""
        chosen = configuration.values.get("device")
        if chosen is not None and chosen.value not in self.devices:
            offered = f"use {' or '.join(self.devices)}" if self.devices else "it has one device"
            raise HandoffError(
                f"device {chosen.value!r} ({chosen.source}) is not one the {self.name} "
                f"backend runs on: {offered}"
            )
        self.configuration = configuration
        device = self.device
        values = dict(configuration.values)
        defaults = (f"{self.name} backend default", "built-in default")
        for key, value in self.device_defaults.get(device, {}).items():
            if key not in values or values[key].source in defaults:
                values[key] = Setting(value, f"{defaults[0]} on {device}")
        self.configuration = Configuration(configuration.backend, values)

    @property
    def device(self) -> str:
        """The device the workers run on: the `device` setting, else the first offered."""
        return str(self.setting("device") or next(iter(self.devices), ""))

    def setting(self, key: str) -> object:
        """The effective value of `key`: the team's setting, else this backend's default, else
        handoff's own."""
        if self.configuration is not None and key in self.configuration.values:
            return self.configuration.get(key)
        return self.defaults.get(key, BUILT_IN.get(key))

    def why_not(self, topology: str) -> str | None:
        """Why this backend does not run `topology`; None when it does."""
        if topology in self.topologies:
            return None
        return self.unsupported.get(topology, "not declared by the backend")

    def ports_of(self, role: str) -> tuple[str, ...]:
        """The names of the ports core leases for a worker in `role`."""
        return self.role_ports.get(role, self.worker_ports)

    def roles(self, topology: str) -> tuple[str, ...]:
        """The worker roles of `topology`, or an error saying why it is not supported."""
        if why := self.why_not(topology):
            raise HandoffError(f"backend {self.name!r} does not run {topology} cases: {why}")
        return self.topologies[topology]

    @abstractmethod
    def check_environment(self) -> None:
        """Raise HandoffError naming what is missing (engine, binary) and how to get it."""

    @abstractmethod
    def prepare_model(self, folder: Path) -> Model:
        """Make the model available under `folder` (or point elsewhere) and describe it."""

    @abstractmethod
    def shape(self, case: Case, variant: int = 0) -> Shape:
        """The prompt and output length of `case`'s request; the output must outlast the fault
        (the graceful bound included), or the case fails as not in flight at the fault.
        Each `variant` (0, 1, ...: the cases a pool served before) gives a prompt of the same
        length that starts with another token, so no case finds another's prefix cached."""

    def spare_workers(self, case: Case) -> int:
        """The spares a pool of `case`'s key keeps of the role its cases fault: the
        `spare_workers` setting, unless the engine cannot afford idle workers there."""
        return int(self.setting("spare_workers"))

    def worker_variant(self, case: Case) -> tuple:
        """What of `case`, beyond its roles and request plane, changes how its workers are
        launched: cases that differ here never share pooled workers. Nothing by default."""
        return ()

    @abstractmethod
    def worker(
        self, role: str, case: Case, model: Model, ports: Mapping[str, int], folder: Path
    ) -> Launch:
        """The command and environment that start one worker of `case` in `role`. `ports` are
        this worker's own (one per `worker_ports` name); files the worker reads go in `folder`,
        the case's own folder."""

    def markers(self, case: Case) -> dict[str, float]:
        """pytest markers of `case` as name -> value: at least TIMEOUT_MARKER (the case's
        timeout for each trial of a race: `policies.race_trials`); GPU engines add
        `profiled_vram_gib` and their KV cap (e.g. `requested_vllm_kv_cache_bytes`)."""
        timeout = float(self.setting("case_timeout_s")) * race_trials(case)
        return {TIMEOUT_MARKER: timeout}

    def in_flight(self, workers: Sequence[Worker]) -> dict[str, float]:
        """The requests each worker reports in flight right now (queued ones included), by
        name, from its own state: by default the in-flight gauge on its `system` port. Raises
        `metrics.Unanswered` when any does not answer: what it holds is unknown."""
        ports = {w.name: w.ports["system"] for w in workers}
        return worker_sums(ports, INFLIGHT, {"dynamo_endpoint": "generate"})

    def engine_running(self, workers: Sequence[Worker]) -> dict[str, float] | None:
        """The requests each worker's engine reports running, by name, from
        `engine_running_gauge` on its `system` port; None where the backend names no such
        gauge. Raises `metrics.Unanswered` when any does not answer or does not export it."""
        if self.engine_running_gauge is None:
            return None
        ports = {w.name: w.ports["system"] for w in workers}
        return worker_sums(ports, self.engine_running_gauge, required=True)

    def holders(self, workers: Sequence[Worker]) -> list[Worker]:
        """The workers that report a request in flight right now (`in_flight`)."""
        inflight = self.in_flight(workers)
        return [w for w in workers if inflight[w.name] > 0]

    def guide(self, api: str) -> Guide:
        """The guide of a guided case's request: by default a JSON schema on chat (as
        `response_format`) and a regular expression on completion. An engine whose model
        cannot spell what these ask gives one it can."""
        if api == "chat":
            return Guide(schema=OBJECT_SCHEMA)
        return Guide(regex=WORDS_REGEX)

    def reference(self, api: str, shape: Shape) -> str | None:
        """The text `shape`'s request must give, computed by handoff from the model's own
        definition rather than by the deployment under test; None where the backend has none
        (a deterministic backend's response is then compared with an undisturbed baseline
        that the deployment serves first)."""
        return None

    def stop_text(self, api: str, shape: Shape, begins: int, ends: int) -> str | None:
        """The text of the reference output's tokens `begins` to `ends` (counted from 0, `ends`
        excluded), as a stop string that matches there first; None where handoff does not know
        the output (the `stop` cases then cannot run: `unsupported` says why)."""
        return None

    def undecided(self, api: str, shape: Shape) -> str | None:
        """Why the reference of a sampling request (`shape.sampling`) does not decide its text:
        a choice closer to the next best than the engine's arithmetic allows. The case is then
        not proven. None: decided, or no sampling request."""
        return None

    def wrong_successors(self, api: str, shape: Shape) -> tuple[str, ...]:
        """How a successor of a sampling request can go wrong, of `policies.RESUMED_AFRESH`
        (it began its sampling state afresh at the move: penalties over the output counted from
        there, a seeded generator seeded again) and `policies.NOT_GIVEN` (it was not given the
        request's sampling); empty where the backend computes none."""
        return ()

    def follows(self, api: str, shape: Shape, carried: int, way: str, text: str) -> bool:
        """Whether `text` is one a sampling request gives when moved after `carried` tokens to
        a successor that went wrong by `way`: each token its computed choice, or within a close
        call of it that the engine's arithmetic may take otherwise."""
        return False

    def top_logprobs(self, case: Case) -> int:
        """How many of the most likely tokens' log-probabilities each generated token of
        `case`'s request carries back, for `logprob_judge`; 0 (none asked) by default."""
        return 0

    def logprob_judge(self, api: str, shape: Shape) -> LogprobJudge | None:
        """What judges the top log-probabilities of each token of `shape`'s response (by token
        text, in order) against the backend's own computation of the model, returning where
        they first depart, or None; None where the backend computes none."""
        return None

    def output_seconds(self, case: Case) -> float | None:
        """How long `case`'s output should stream, where the engine's pace differs from one
        machine to the next: the case's request is then cut, at run time, to that many seconds
        of tokens at the rate a warm-up request measures (handoff.responses.pace), its shape's
        max_tokens at most. None: the shape's max_tokens stand."""
        return None

    def nominal_response_s(self, case: Case, shape: Shape) -> float | None:
        """How long `shape`'s response takes from its request to its last token on an idle
        machine, where the backend knows it by its own definition (a simulated engine's
        speeds); None where only a measurement can tell. It bounds a response faulted before
        its first token, which has no tokens of its own to measure a rate from."""
        return None

    def output_tokens(self, text: str) -> int | None:
        """How many tokens `text` of the model's output is, where the backend can tell without
        a tokenizer; None where it cannot (continuity then checks usage only)."""
        return None

    def output_token_ids(self, text: str) -> list[int] | None:
        """The token ids of `text` of the model's output, where the backend can tell without a
        tokenizer; None where it cannot (the re-issued context is then judged by timing)."""
        return None

    def token_origin(self, token_id: int) -> Origin | None:
        """Which worker of the deployment generated `token_id` and where in its own output it
        stands, where the engines' outputs tell it (the mocker's replayed outputs); None where
        the token does not: where a new worker's tokens begin is then judged otherwise."""
        return None

    def token_worker(self, worker: Worker) -> int | None:
        """The worker number `token_origin` names in `worker`'s tokens; None where its tokens
        name none. Which runs of a response are whose is then checked against the workers that
        received the request (`sequences.unserved`)."""
        return None

    def received_context(self, worker: Worker, prompt: str) -> list[int] | None:
        """The token ids `worker`'s engine holds after `prompt` (the case's prompt text) for a
        request it received, in order, as its own record says (a migrated request's re-issued
        context, then what the worker generated); None where the engine keeps no such record,
        or it cannot be read: the re-issued context is then judged by timing. Called once the
        response has ended."""
        return None

    def decoding_at_once(self, case: Case) -> int | None:
        """How many requests one worker of `case` decodes at once, where the engine is told
        (vLLM's and the mocker's `--max-num-seqs`): of the requests a worker holds, those it
        received later wait queued. None: no limit below a load case's requests."""
        return None

    def kv_transfer_floor_s(self, case: Case) -> float | None:
        """The least time the KV transfer of `case`'s prompt takes, or None if unknown: a first
        token sooner than this proves no transfer happened (kv_transfer cases)."""
        return None
