"""handoff's embedded default: Dynamo's real frontend with its CPU `mocker` engine.

The mocker simulates timing, not weights: a token takes about 5.8 ms at speedup ratio 1, and a
KV transfer takes prompt tokens x KV bytes per token / the simulated bandwidth. Each case gets
the shortest request that still outlasts its fault: a worker_failure case only needs tokens
left after the SIGKILL; a graceful_shutdown case must still be running when the 2 s bound
passes, with about half a second to spare.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib.metadata import version
from pathlib import Path
from typing import ClassVar

from handoff import releases
from handoff.backend import VLLM_RUNNING, Backend, Launch, Model, Shape, Worker
from handoff.cases import ABANDONS, KILLS, SAMPLINGS, STOPS, Case, topology
from handoff.client import Annotations
from handoff.errors import HandoffError
from handoff.plugins import hookimpl
from handoff.sequences import Origin
from handoff.word_tokenizer import DISTINCT_PROMPTS, count, prompt, token_ids
from handoff_mocker import kv_record, origins
from handoff_mocker.model import write_model

MODEL_NAME = "handoff-mocker"
SPEEDUP_RATIO = 1.0
#: Passed explicitly so the simulated transfer time is known, not derived from config.json.
KV_BYTES_PER_TOKEN = 512
GB = 1e9

KV_CONTEXT = 1024
#: What a load case's worker decodes at once (`--max-num-seqs`): of the 3 requests the router
#: gives the busiest of 3 workers, the last one it received waits queued.
LOAD_DECODING = 2
#: A decode step at speedup ratio 1 (the module's docstring).
STEP_S = 0.0058
#: A prefill of the cases' contexts (32 to a few hundred tokens) at speedup ratio 1: 17 ms
#: measured (344 ms at 0.05).
PREFILL_S = 0.017


#: The mocker's flags handoff passes (`MockerBackend.worker`).
MOCKER_FLAGS = (
    "--model-path", "--model-name", "--request-plane", "--disaggregation-mode",
    "--extra-engine-args", "--zmq-kv-events-ports", "--zmq-replay-ports",
)  # fmt: skip


@dataclass(frozen=True)
class Timing:
    """One case's request and the mocker's speeds that make it outlast its fault."""

    prompt_tokens: int
    output: int
    #: Simulated KV transfer bandwidth of prefill workers; 0 turns the transfer delay off.
    transfer_gbps: float = 0.0
    decode_speedup: float = 1.0
    #: The speedup ratio the worker prefills at, at most (a backend made slower, as tests
    #: make one, prefills slower still); its decode keeps `decode_speedup`.
    prefill_ratio: float = 1.0


#: (topology, fault) -> timing. Margins allow for the harness being late to the fault: on an
#: overloaded machine (-n 8 on 2 cores) it took 0.5 s from request to fault, with 67 tokens out.
#: - aggregate, decode: 400 tokens (2.3 s) outlast a late SIGKILL; 600 (3.5 s) a late SIGSTOP
#:   or cut; 900 (5.2 s) the graceful bound, and an expired drain's 1 s timeout. Each was
#:   shorter once, and beside the whole suite (-n 6 on 2 cores) the fault came after the worker
#:   had finished: a unary request's SIGKILL 0.3-1.0 s after its proof, past 200 tokens; the
#:   cut's rules 2.1 s after the fault was sent; the drain's SIGKILL 3.5 s after its SIGTERM.
#:   The broker's faults leave the streams in progress alone, but are made on the holder held
#:   (`faults.hold`), found and proven first: 400 tokens, as a kill. At 200 (1.2 s), finding
#:   the decode topology's holder under the busy loop took 1.5 s, and the window was missed.
#: - kv_transfer: the seed's 823-token prefix in a 1,024-token context, 192 output tokens. The
#:   transfer takes 0.42 s against ~0.02 s of prefill alone; decoding at 0.2x makes the 192
#:   tokens last 5.6 s: past the graceful bound with the room a drain needs
#:   (`faults.require_room`; at 0.3x, 3.5 s were left of 2.3 s needed on a quiet machine), and
#:   past a SIGKILL that the transfer's proof made late: at full speed a loaded machine (-n 6
#:   on 2 cores) killed the worker after it had decoded its last token. Both cases then share
#:   a pool.
#: - load: 900 tokens, and 1,500 for a kill or a drain: its eight requests must all be placed,
#:   and the queued one must still wait, when the fault lands. With 62 cases at once on two
#:   cores, placing them took 3 s and a drain's SIGKILL came 3 s later, after 900 tokens had
#:   ended. A stall or a cut keeps 900: its stream timeout is sized from that length.
#: - join: 1,800 tokens: its kill's probes wait until the frontend drops the killed worker,
#:   whose discovery lease lingers 10 s (docs/known-issues.md), while the load is still open:
#:   the eight requests end in two or three rounds of about 11 s on two slots a worker (2,400
#:   made the longest case of the main job 34-47 s, the rounds deciding; benchmarks/RESULTS.md).
#: - rolling: 900 tokens: its client keeps sending new requests the whole roll.
#: - prefill: the fault lands during the prefill worker's transfer, before the first token: 2 s
#:   (the holder found and proven on a machine twice as slow), or 5.3 s for a drain, which
#:   must have its 2 s graceful bound and twice the harness's lag left when its SIGTERM goes
#:   out (`handoff.windows`): at 3.2 s a 1.5x slower machine missed it in 1 run of 11.
#: - guided, choices, abandoned: the aggregate's timing of the worker fault that comes first
#:   (a close with none comes when a kill would).
#: `ONE_REQUEST` holds the aggregate's and the decode topology's, by fault.
ONE_REQUEST = {
    "worker_failure": Timing(32, 400),
    "graceful_shutdown": Timing(32, 900),
    "worker_stall": Timing(32, 600),
    "stall_past_lease": Timing(32, 600),
    "partition": Timing(32, 600),
    "broker_stall": Timing(32, 400),
    "broker_loss": Timing(32, 400),
    "drain_expired": Timing(32, 900),
}
#: The workers of one request's cases prefill 20x slower than the mocker's ratio 1 and decode
#: as fast: a migrated stream's new worker (or the decode topology's prefill worker, for the
#: new decode worker) prefills the re-issued context for about 350 ms before the first token.
#: Neither worker keeps a record of the context it received by default, so where the new
#: worker's tokens begin is told by the pause before them (continuity.boundary): the re-prefill
#: alone (about 25 ms) did not stand out from the stalls of a client reading beside eleven
#: other cases on two cores (53 ms seen). The decode topology once made its pause a simulated
#: KV transfer instead, 0.25 s for the 32-token prompt; but a transfer grows with the tokens
#: the context carries: a cut that landed late under load (387 tokens through) took 3.3 s,
#: and Dynamo 1.6.1's HTTP layer ended the moved stream silently at twice the stream timeout
#: (docs/known-issues.md). Not in a load case: its bound takes the rate of the slowest stream
#: at the fault, which eight slow prefills in turn would leave a token or two old.
SLOW_PREFILL = 0.05
ONE_REQUEST_SLOW_PREFILL = {
    fault: replace(timing, prefill_ratio=SLOW_PREFILL) for fault, timing in ONE_REQUEST.items()
}
#: The discovery plane's faults timed as the aggregate's fault they are.
LIKE = {"stall_past_lease": "stall_past_lease"}
TIMINGS = {
    **{
        (name, fault): ONE_REQUEST_SLOW_PREFILL[fault]
        for name in ("aggregate", "decode")
        for fault in topology(name).allowed()["fault"]
    },
    **{
        (name, fault): Timing(32, 1500 if fault in KILLS else 900)
        for name in ("load", "decode_load")
        for fault in topology(name).allowed()["fault"]
    },
    **{("join", fault): Timing(32, 1800) for fault in KILLS},
    ("rolling", "graceful_shutdown"): Timing(32, 900),
    **{
        (name, fault): ONE_REQUEST_SLOW_PREFILL[fault]
        for name in ("guided", "choices", "usage")
        for fault in KILLS
    },
    **{
        ("abandoned", fault): ONE_REQUEST_SLOW_PREFILL[first or "worker_failure"]
        for fault, first in ABANDONS.items()
    },
    ("kv_transfer", "worker_failure"): Timing(823, 192, 0.001, decode_speedup=0.2),
    ("kv_transfer", "graceful_shutdown"): Timing(823, 192, 0.001, decode_speedup=0.2),
    ("prefill", "worker_failure"): Timing(823, 64, transfer_gbps=0.00021),
    ("prefill", "graceful_shutdown"): Timing(823, 64, transfer_gbps=0.00008),
    # The discovery plane's: a stall's as in the aggregate; every other as a kill's: each is
    # made on a held holder (`faults.hold`), so the request need only outlast its proof, and
    # ends well inside the lease (etcd_loss's frontend is read before it ends itself).
    **{
        ("discovery", fault): ONE_REQUEST_SLOW_PREFILL[LIKE.get(fault, "worker_failure")]
        for fault in topology("discovery").allowed()["fault"]
    },
}


#: The `nice` increment of every mocker worker: twelve cases at once on two cores, the clients
#: reading the streams (and the frontends) go first, so a client keeps up with its tokens and
#: a move's pause in its reading is the move's (`continuity.boundary`), not a backlog.
WORKER_NICENESS = 10


#: Why the stop cases run on vLLM's CPU engine only.
NOT_THE_REST = (
    "the mocker's new worker emits its own output, not the rest of the first one's: a stop "
    "string planned over the output could never match after the move: qualified on vLLM's CPU "
    "engine"
)
NO_LOGITS = (
    "the mocker draws no token from logits, so no penalty or seed changes its output: "
    "qualified on vLLM's CPU engine"
)


class MockerBackend(Backend):
    name = "mocker"
    sessions = {"": "mocker_pre_merge"}
    version = version("handoff-mocker")
    topologies: ClassVar[dict[str, tuple[str, ...]]] = {
        "aggregate": ("aggregate", "aggregate"),
        "decode": ("prefill", "decode", "decode"),
        "kv_transfer": ("prefill", "decode", "decode"),
        "prefill": ("prefill", "prefill", "decode"),
        "guided": ("aggregate", "aggregate"),
        "choices": ("aggregate", "aggregate"),
        "usage": ("aggregate", "aggregate"),
        "abandoned": ("aggregate", "aggregate"),
        "load": ("aggregate", "aggregate", "aggregate"),
        "decode_load": ("prefill", "decode", "decode", "decode"),
        "join": ("aggregate", "aggregate", "aggregate"),
        "rolling": ("aggregate", "aggregate", "aggregate"),
        "discovery": ("aggregate", "aggregate"),
    }
    unsupported: ClassVar[dict[str, str]] = {
        "decode_race": "the mocker's workers take the frontend's cancellation the moment they "
        "run again, so the race never shows (docs/known-issues.md): qualified on vLLM's CPU "
        "engine",
        "engine_core": "the mocker's engine runs inside its worker process: there is no engine "
        "core apart from the worker to kill (worker_failure kills both)",
        **dict.fromkeys(STOPS, NOT_THE_REST),
        **dict.fromkeys(SAMPLINGS, NO_LOGITS),
    }
    #: Importing the mocker opens nothing: its workers fork from a warm interpreter.
    preloaded: ClassVar[dict[str, str]] = {"dynamo.mocker": "dynamo.mocker.main"}
    #: `kv_events` and `kv_replay`: the ZMQ ports its KV events go out on and are replayed
    #: from (`received_context`), leased only with `kv_record`: the mocker binds both on every
    #: address, a bind address fixed in its runtime, and handoff's servers bind loopback only.
    #: A decode worker stores no KV blocks of its own and has none.
    worker_ports = ("system", "kv_events", "kv_replay")
    role_ports: ClassVar[dict[str, tuple[str, ...]]] = {"decode": ("system",)}
    migration_counts = "exact"
    #: The mocker's scheduler exports vLLM's gauge of the requests it runs (with `engine` and
    #: `model_name` labels), beside the handler's: 1 while it decodes, 0 once it stopped.
    engine_running_gauge = VLLM_RUNNING
    defaults: ClassVar[dict[str, object]] = {
        **Backend.defaults,
        "case_timeout_s": 90.0,
        "load_requests": 8,
    }
    #: The mocker serves its own tokenizer-only model and needs no image or model cache.
    #: Measured: the 62 pre-merge cases, 12 at a time on 2 CPUs with their processes forked
    #: from a warm interpreter, kept the CPUs busy 68-78 CPU-s over 573-595 s of their own
    #: time (0.12-0.13 CPUs a case; benchmarks/RESULTS.md): a case mostly waits on its
    #: request, its fault and the frontend's timeouts.
    cpus_per_case_on_1_6 = 0.125
    distinct_prompts = DISTINCT_PROMPTS
    nondeterministic_because = "the mocker draws each token at random"
    #: The mocker emits one token per step and the frontend forwards each in its own frame.
    one_token_per_frame = True
    uses_settings = (
        "max_tokens", "graceful_bound_s", "stream_timeout_s", "case_timeout_s", "startup_timeout_s",
        "fresh_deployments", "spare_workers", "discovery", "durations_file", "load_requests",
        "dynamo", "beside", "mix",
    )  # fmt: skip
    release_modules: ClassVar[dict[str, tuple[str, ...]]] = {
        "dynamo.frontend": releases.FRONTEND_FLAGS,
        "dynamo.mocker": MOCKER_FLAGS,
    }

    def __init__(self, speedup_ratio: float = SPEEDUP_RATIO, kv_record: bool = False) -> None:
        """`kv_record`: the workers keep and replay their KV blocks' token ids, the record of
        the context a migrated request's new worker received (`received_context`); off by
        default, since their replay port binds every address (see `worker_ports`)."""
        self.speedup_ratio = speedup_ratio
        self.kv_record = kv_record

    @property
    def cpus_per_case(self) -> float:  # type: ignore[override]
        """The measured 0.125, scaled by what a case costs on the installed release."""
        return self.cpus_per_case_on_1_6 * releases.current().mocker_cpu_scale

    def ports_of(self, role: str) -> tuple[str, ...]:
        return super().ports_of(role) if self.kv_record else ("system",)

    def check_environment(self) -> None:
        if importlib.util.find_spec("dynamo") is None:
            raise HandoffError(
                "Dynamo is not installed in this environment: run `nox -s mocker_pre_merge`, "
                "which installs it, or see the README for the manual install"
            )

    def prepare_model(self, folder: Path) -> Model:
        write_model(folder)
        return Model(MODEL_NAME, folder)

    def timing(self, case: Case) -> Timing:
        """The request and speeds that make `case` outlast its fault (`TIMINGS`)."""
        return TIMINGS[(case.topology, case.fault)]

    def shape(self, case: Case, variant: int = 0) -> Shape:
        timing = self.timing(case)
        configured = self.setting("max_tokens") or {}
        output = configured.get(case.topology, timing.output)
        annotations = Annotations((origins.ANNOTATION,), output) if self.replays(case) else None
        text = prompt(timing.prompt_tokens, variant)
        return Shape(text, timing.prompt_tokens, output, annotations=annotations)

    def replays(self, case: Case) -> bool:
        """Whether `case`'s workers replay outputs of their own (handoff_mocker.origins): where
        every worker is aggregated, and the request asks for neither a guide nor several
        draws, which a replayed output does not keep."""
        aggregated = set(self.topologies[case.topology]) == {"aggregate"}
        return aggregated and topology(case.topology).request not in ("guided", "choices")

    def worker_variant(self, case: Case) -> tuple:
        """The speed of the mocker's decode and transfer, set per fault by its timing, and the
        requests it decodes at once where that is limited."""
        timing = self.timing(case)
        speeds = (timing.decode_speedup, timing.transfer_gbps, timing.prefill_ratio)
        decoding = self.decoding_at_once(case)
        speeds = speeds if decoding is None else (*speeds, f"seqs{decoding}")
        return (*speeds, f"len{cap}") if (cap := self.context_cap(case)) else speeds

    def context_cap(self, case: Case) -> int | None:
        """A replaying worker's context (`max_model_len`): the prompt plus the output, so that
        a new worker given the prompt and the tokens sent emits exactly the rest."""
        if not self.replays(case):
            return None
        shape = self.shape(case)
        return shape.prompt_tokens + shape.max_tokens

    def engine(self, role: str, case: Case) -> dict[str, object]:
        """The engine settings of a worker of `case` in `role`, as the mocker's engine-args
        file holds them (`--extra-engine-args`: the mocker then reads its engine's settings
        from the file alone). Each KV block it stores carries its token ids, which only the
        engine's own KV events can (`emit_kv_token_ids` needs `emit_kv_events`)."""
        timing = self.timing(case)
        engine: dict[str, object] = {
            "speedup_ratio": self.prefill_ratio(timing),
            "decode_speedup_ratio": self.decode_ratio(timing) / self.prefill_ratio(timing),
            "worker_type": {"aggregate": "aggregated"}.get(role, role),
            "kv_transfer_bytes_per_token": KV_BYTES_PER_TOKEN,
            "emit_kv_events": True,
            "emit_kv_token_ids": self.kv_record,
        }
        if case.topology == "kv_transfer":
            engine["max_model_len"] = KV_CONTEXT
        if (cap := self.context_cap(case)) is not None:
            engine["max_model_len"] = cap
        if role == "prefill":
            engine["kv_transfer_bandwidth"] = timing.transfer_gbps
        if (decoding := self.decoding_at_once(case)) is not None:
            engine["max_num_seqs"] = decoding
        return engine

    def worker(
        self, role: str, case: Case, model: Model, ports: Mapping[str, int], folder: Path
    ) -> Launch:
        # The local indexer is on, as the mocker's command line has it by default.
        dynamo: dict[str, object] = {"enable_local_indexer": True}
        engine_args = folder / f"engine-{role}-{ports['system']}.json"
        folder.mkdir(parents=True, exist_ok=True)
        if self.replays(case):
            output = self.shape(case).max_tokens
            trace = origins.write_trace(folder, ports["system"], output)
            dynamo["response_replay_trace_path"] = str(trace)
        settings = engine_arguments(self.engine(role, case), dynamo, releases.current())
        engine_args.write_text(json.dumps(settings, indent=2) + "\n")
        argv = [
            sys.executable, "-m", "dynamo.mocker",
            "--model-path", str(model.path),
            "--model-name", model.name,
            "--request-plane", case.plane,
            "--disaggregation-mode", {"aggregate": "agg"}.get(role, role),
            "--extra-engine-args", str(engine_args),
        ]  # fmt: skip
        if "kv_replay" in ports:
            argv += ["--zmq-kv-events-ports", str(ports["kv_events"])]
            argv += ["--zmq-replay-ports", str(ports["kv_replay"])]
        return Launch(argv, {"DYN_SYSTEM_PORT": str(ports["system"])}, WORKER_NICENESS)

    def output_token_ids(self, text: str) -> list[int] | None:
        """Each word `tN` of the mocker's model is token id N (handoff.word_tokenizer)."""
        return token_ids(text)

    def received_context(self, worker: Worker, prompt: str) -> list[int] | None:
        """What the worker's KV blocks hold after `prompt` (`kv_record`): a migrated request's
        re-issued context as the worker received it, then the mocker's own ids of the tokens it
        generated. None for a worker with no replay port (decode), or a record unread."""
        if "kv_replay" not in worker.ports or (ids := token_ids(prompt)) is None:
            return None
        try:
            return kv_record.after_prefix(kv_record.stored_blocks(worker.ports["kv_replay"]), ids)
        except kv_record.Unread:
            return None

    def token_origin(self, token_id: int) -> Origin | None:
        return origins.origin(token_id)

    def token_worker(self, worker: Worker) -> int | None:
        """The number of the output its trace replays (`worker`'s engine arguments name it)."""
        argv = worker.process.argv
        settings = json.loads(Path(argv[argv.index("--extra-engine-args") + 1]).read_text())
        trace = settings.get("dynamo", settings).get("response_replay_trace_path")
        return None if trace is None else origins.first_worker(Path(trace))

    def output_tokens(self, text: str) -> int:
        """Each token of the mocker's model is one word `tN` (handoff.word_tokenizer)."""
        return count(text)

    def nominal_response_s(self, case: Case, shape: Shape) -> float | None:
        """The simulated transfer, the prefill, then one step a token at the case's speeds."""
        timing = self.timing(case)
        prefill_s = PREFILL_S / self.prefill_ratio(timing)
        steps_s = shape.max_tokens * STEP_S / self.decode_ratio(timing)
        return (self.kv_transfer_floor_s(case) or 0.0) + prefill_s + steps_s

    def prefill_ratio(self, timing: Timing) -> float:
        return min(self.speedup_ratio, timing.prefill_ratio)

    def decode_ratio(self, timing: Timing) -> float:
        return self.speedup_ratio * timing.decode_speedup

    def decoding_at_once(self, case: Case) -> int | None:
        return LOAD_DECODING if topology(case.topology).load else None

    def kv_transfer_floor_s(self, case: Case) -> float | None:
        timing = self.timing(case)
        if not timing.transfer_gbps:
            return None
        return timing.prompt_tokens * KV_BYTES_PER_TOKEN / (timing.transfer_gbps * GB)


def engine_arguments(
    engine: dict[str, object], dynamo: dict[str, object], release: releases.Facts
) -> dict[str, object]:
    """The mocker's engine-arguments file as `release` reads it: an `engine` and a `dynamo`
    section, or one flat object without the KV event switches it lacks."""
    if release.mocker_engine_args == releases.SECTIONS:
        return {"engine": engine, "dynamo": dynamo}
    if not release.mocker_kv_event_switches:
        if engine.get("emit_kv_token_ids"):
            raise HandoffError(
                f"Dynamo {release.version}'s mocker cannot emit its KV blocks' token ids "
                f"(kv_record): use Dynamo 1.6.0 or later"
            )
        engine = {k: v for k, v in engine.items() if not k.startswith("emit_kv_")}
    return {**engine, **dynamo}


@hookimpl
def register_backends(register) -> None:
    register(MockerBackend())
