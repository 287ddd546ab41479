"""The vLLM, SGLang and TRT-LLM backends, checked without a GPU: their worker launches against
checked-in goldens and against Dynamo's own flag definitions, their ports, their requests, and
the cases `handoff cases` lists for them."""

from __future__ import annotations

import argparse
import json
import re
import sys
from itertools import count
from pathlib import Path

import pytest
import yaml

from handoff import cli, deployment, plugins
from handoff.backend import Model
from handoff.cases import TOPOLOGIES, Case, selection
from handoff.errors import HandoffError
from handoff.gpu_backend import (
    CONTEXT_TOKENS,
    DEFAULT_MODEL,
    FIRST_ON_CPUS,
    LOAD_NOT_BUILT,
    NOT_BUILT_ON_GPUS,
    SENTENCE,
    DynamoGpuBackend,
)
from handoff.machine import services
from handoff.machine.environment import missing_modules
from handoff.policies import POLICIES
from handoff.settings import Configuration, Setting
from handoff_sglang import SglangBackend
from handoff_trtllm import TrtllmBackend, engine_config
from handoff_vllm import KV_TRANSFER_CONFIG, VllmBackend, tiny_model

GOLDEN = Path(__file__).parent / "golden"
BACKENDS = {b.name: b for b in (VllmBackend, SglangBackend, TrtllmBackend)}
GPU_TOPOLOGIES = ("aggregate", "decode", "kv_transfer")


#: Ports core leases for every worker that a worker of that role has no use for.
def configured(cls: type[DynamoGpuBackend], **settings: object) -> DynamoGpuBackend:
    backend = cls()
    values = {k: Setting(v, f"{cls.name} backend default") for k, v in cls.defaults.items()}
    values.update({k: Setting(v, "test") for k, v in settings.items()})
    backend.configure(Configuration(cls.name, values))
    return backend


def first_case(backend: DynamoGpuBackend, topology: str) -> Case:
    return selection(topology, "pre_merge", backend)[0]


def render(backend: DynamoGpuBackend, case: Case, folder: Path) -> list[dict]:
    """Every worker of `case` as core launches them: ports leased one by one after the
    frontend's (and NATS's), one per `worker_ports` name for each worker, in launch order."""
    leases = count(20000)
    next(leases)  # the frontend's HTTP port
    if case.plane == "nats":
        next(leases)
    model = backend.prepare_model(folder / "model")
    workers = []
    for i, role in enumerate(backend.roles(case.topology)):
        ports = {name: next(leases) for name in backend.ports_of(role)}
        launch = backend.worker(role, case, model, ports, folder)
        workers.append(
            {"name": f"worker-{i}-{role}", "role": role, "ports": ports,
             "argv": list(launch.argv), "env": dict(launch.env), "niceness": launch.niceness}
        )  # fmt: skip
    return workers


def normalized(text: str, folder: Path) -> str:
    return text.replace(sys.executable, "<python>").replace(str(folder), "<case folder>")


def golden_view(
    backend: DynamoGpuBackend, folder: Path, topologies: tuple[str, ...] = GPU_TOPOLOGIES
) -> dict:
    view = {}
    for topology in topologies:
        case = first_case(backend, topology)
        here = folder / topology
        workers = []
        for w in render(backend, case, here):
            worker = {
                "name": w["name"],
                "ports": w["ports"],
                "argv": [normalized(a, here) for a in w["argv"]],
                "env": {k: normalized(v, here) for k, v in w["env"].items()},
            }
            if w["niceness"]:  # a GPU worker runs at the default priority
                worker["niceness"] = w["niceness"]
            workers.append(worker)
        files = {p.name: p.read_text() for p in sorted(here.glob("*.yaml"))}
        view[topology] = {"case": case.key, "workers": workers, "files": files}
    return view


@pytest.mark.parametrize("name", BACKENDS)
def test_worker_launches_match_the_reviewed_goldens(name, tmp_path):
    """The argv and env of every worker of every topology, and the files they read. A change
    here is a change to what runs on the GPU: review it, then update the golden file."""
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    assert golden_view(BACKENDS[name](), tmp_path) == expected


# Dynamo's own flag definitions: each engine's worker splits its command line into Dynamo's
# flags (the runtime group and the engine's Dynamo group) and the engine's native ones.
NATIVE = {
    "vllm": {
        "all": {"--model", "--served-model-name", "--enforce-eager", "--max-model-len",
                "--max-num-seqs", "--block-size", "--num-gpu-blocks-override",
                "--gpu-memory-utilization", "--master-port", "--no-enable-prefix-caching"},
        "aggregate": {"--kv-events-config"},
        "prefill": {"--kv-transfer-config", "--kv-events-config"},
        "decode": {"--kv-transfer-config"},
    },
    "sglang": {
        "all": {"--model-path", "--served-model-name", "--page-size", "--tp", "--nccl-port",
                "--disable-cuda-graph", "--max-running-requests", "--max-total-tokens",
                "--context-length", "--disable-radix-cache"},
        "aggregate": {"--skip-tokenizer-init"},
        "prefill": {"--disaggregation-mode", "--disaggregation-bootstrap-port", "--host",
                    "--disaggregation-transfer-backend", "--enable-metrics", "--port"},
        "decode": {"--disaggregation-mode", "--disaggregation-bootstrap-port", "--host",
                   "--disaggregation-transfer-backend", "--enable-metrics"},
    },
    "trtllm": {"all": set()},
}  # fmt: skip
#: The --disaggregation-mode Dynamo must parse per role, where it is a Dynamo flag.
DYNAMO_MODE = {
    "vllm": {"aggregate": None, "prefill": "prefill", "decode": "decode"},
    "trtllm": {"aggregate": "agg", "prefill": "prefill", "decode": "decode"},
}


def dynamo_parser(groups: dict, engine: str) -> argparse.ArgumentParser:
    # Exact flag names only: Dynamo's workers parse their engine's native flags in the same
    # parser (or, for vLLM, with abbreviations off), so no native flag is read as a prefix of
    # a Dynamo one.
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    groups["runtime"]().add_arguments(parser)
    groups[engine]().add_arguments(parser)
    return parser


def flags(argv: list[str]) -> set[str]:
    return {a for a in argv if a.startswith("--")}


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("topology", GPU_TOPOLOGIES)
@pytest.mark.parametrize("plane", ["nats", "tcp"])
def test_dynamo_parses_every_dynamo_flag_and_leaves_the_engine_ones(
    name, topology, plane, dynamo_groups, tmp_path, monkeypatch
):
    # The discovery is the deployment's environment's (services.runtime_env), never a flag.
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "etcd")
    backend = BACKENDS[name]()
    case = next(c for c in selection(topology, "nightly", backend) if c.plane == plane)
    for worker in render(backend, case, tmp_path):
        argv = worker["argv"][3:]  # without `python -m dynamo.<engine>`
        assert worker["argv"][:3] == [sys.executable, "-m", f"dynamo.{name}"]
        args, leftover = dynamo_parser(dynamo_groups, name).parse_known_args(argv)
        native = NATIVE[name]["all"] | NATIVE[name].get(worker["role"], set())
        assert flags(leftover) == native, worker["name"]
        assert args.discovery_backend == "etcd" and "--discovery-backend" not in argv
        assert args.request_plane == plane
        if name in DYNAMO_MODE:
            assert args.disaggregation_mode == DYNAMO_MODE[name][worker["role"]]
        if name == "trtllm":
            assert args.model == DEFAULT_MODEL and args.served_model_name == DEFAULT_MODEL
            assert args.max_seq_len == args.max_num_tokens == CONTEXT_TOKENS
            assert Path(args.extra_engine_args).is_file()


def test_sglang_disaggregation_modes_are_sglang_ones(tmp_path):
    """For SGLang --disaggregation-mode is the engine's own flag: prefill or decode (its
    aggregate mode, `null`, is the default and is not passed)."""
    backend = SglangBackend()
    for worker in render(backend, first_case(backend, "decode"), tmp_path):
        argv = worker["argv"]
        assert argv[argv.index("--disaggregation-mode") + 1] == worker["role"]
    for worker in render(backend, first_case(backend, "aggregate"), tmp_path):
        assert "--disaggregation-mode" not in worker["argv"]


def test_vllm_disaggregated_workers_name_the_nixl_connector(tmp_path):
    """dynamo.vllm.args refuses a prefill worker without an explicit --kv-transfer-config."""
    backend = VllmBackend()
    for topology in ("decode", "kv_transfer"):
        for worker in render(backend, first_case(backend, topology), tmp_path):
            argv = worker["argv"]
            config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
            assert config == KV_TRANSFER_CONFIG
            assert config["kv_connector"] == "NixlConnector" and config["kv_role"] == "kv_both"


#: How each engine is told not to serve a prompt from KV it kept from an earlier request.
NO_PREFIX_CACHE = {"vllm": "--no-enable-prefix-caching", "sglang": "--disable-radix-cache"}


@pytest.mark.parametrize(
    ("name", "settings"),
    [("vllm", {"device": "cuda"}), ("vllm", {"device": "cpu"}), ("sglang", {}), ("trtllm", {})],
)
def test_no_worker_serves_a_prompt_from_its_prefix_cache(name, settings, monkeypatch, tmp_path):
    """Every worker of every topology on every device computes each request whole: an earlier
    request (an undisturbed baseline, a pool's earlier case) leaves nothing a later prefill
    reuses."""
    monkeypatch.setattr(tiny_model, "ensure", lambda seed=0, root=None: tmp_path / "tiny")
    backend = configured(BACKENDS[name], **settings)
    for topology in GPU_TOPOLOGIES:
        for worker in render(backend, first_case(backend, topology), tmp_path / topology):
            argv = worker["argv"]
            if name == "trtllm":
                path = Path(argv[argv.index("--extra-engine-args") + 1])
                config = yaml.safe_load(path.read_text())["kv_cache_config"]
                assert config["enable_block_reuse"] is False, worker["name"]
            else:
                assert argv.count(NO_PREFIX_CACHE[name]) == 1, worker["name"]


def hosts(worker: dict) -> list[str]:
    argv, env = worker["argv"], worker["env"]
    texts = [*argv, *env.values()]
    found = [h for t in texts for h in re.findall(r"\b(\d+\.\d+\.\d+\.\d+)\b", t)]
    found += [h for t in texts for h in re.findall(r"://([^:/\s]+)", t)]
    found += [argv[i + 1] for i, a in enumerate(argv) if a == "--host"]
    found += [v for k, v in env.items() if k.endswith("_HOST")]
    found += [w for t in texts for w in ("localhost", "0.0.0.0") if w in t]
    return found


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("topology", GPU_TOPOLOGIES)
def test_every_host_is_loopback(name, topology, tmp_path):
    backend = BACKENDS[name]()
    for worker in render(backend, first_case(backend, topology), tmp_path):
        assert set(hosts(worker)) <= {services.LOOPBACK}, worker


def ports_in(worker: dict) -> set[int]:
    """Every port number a launch names: values of port flags, of *PORT* variables, and of
    host:port in URLs (such as the KV events endpoint inside a JSON flag)."""
    argv, env = worker["argv"], worker["env"]
    found = {int(argv[i + 1]) for i, a in enumerate(argv) if a.startswith("--") and "port" in a}
    found |= {int(v) for k, v in env.items() if "PORT" in k}
    found |= {int(p) for t in [*argv, *env.values()] for p in re.findall(r"://[^:/\s]+:(\d+)", t)}
    return found


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("topology", GPU_TOPOLOGIES)
@pytest.mark.parametrize("plane", ["nats", "tcp"])
def test_workers_never_share_a_port_and_use_what_they_lease(name, topology, plane, tmp_path):
    backend = BACKENDS[name]()
    case = next(c for c in selection(topology, "nightly", backend) if c.plane == plane)
    workers = render(backend, case, tmp_path)
    seen: dict[int, str] = {}
    for worker in workers:
        leased = worker["ports"]  # what core leases for this role: backend.ports_of(role)
        assert "system" in leased and set(leased) <= set(backend.worker_ports)
        named = ports_in(worker)
        assert named == set(leased.values()), worker  # each lease used; no stray or fixed port
        for port in named:
            assert port not in seen, f"{worker['name']} and {seen[port]} share port {port}"
            seen[port] = worker["name"]


def test_trtllm_engine_args_files_parse_back(tmp_path):
    backend = TrtllmBackend()
    for topology in GPU_TOPOLOGIES:
        for worker in render(backend, first_case(backend, topology), tmp_path / topology):
            argv = worker["argv"]
            path = Path(argv[argv.index("--extra-engine-args") + 1])
            assert path.parent == tmp_path / topology
            assert path.name == f"trtllm-{worker['role']}-{worker['ports']['system']}.yaml"
            config = yaml.safe_load(path.read_text())
            assert config == engine_config(worker["role"])
            assert config["kv_cache_config"]["max_tokens"] == 4096
            disaggregated = worker["role"] != "aggregate"
            assert ("cache_transceiver_config" in config) == disaggregated


@pytest.mark.parametrize("name", BACKENDS)
def test_every_request_fits_the_context(name):
    backend = BACKENDS[name]()
    for topology in GPU_TOPOLOGIES:
        for case in selection(topology, "nightly", backend):
            shape = backend.shape(case)
            assert shape.prompt_tokens + shape.max_tokens <= CONTEXT_TOKENS
            words = len(re.findall(r"\w+|\.", shape.prompt))
            template = 8 if case.api == "chat" else 0
            assert words + template == shape.prompt_tokens


def test_request_lengths_per_topology_and_team_overrides():
    backend = configured(VllmBackend, max_tokens={"aggregate": 256})
    shapes = {t: backend.shape(first_case(backend, t)) for t in GPU_TOPOLOGIES}
    assert {t: s.max_tokens for t, s in shapes.items()} == {
        "aggregate": 256, "decode": 512, "kv_transfer": 192,
    }  # fmt: skip
    assert shapes["kv_transfer"].prompt_tokens == 823
    assert shapes["aggregate"].prompt.startswith("".join(SENTENCE) + " This is")
    too_long = configured(VllmBackend, max_tokens={"kv_transfer": 300})
    with pytest.raises(HandoffError, match="does not fit the 1024-token context"):
        too_long.shape(first_case(too_long, "kv_transfer"))


def test_the_model_comes_by_name_unless_a_local_path_is_set(tmp_path):
    plain = VllmBackend().prepare_model(tmp_path / "model")
    assert plain == Model(DEFAULT_MODEL, None)
    policy = POLICIES["migration_enabled"]
    command = deployment.frontend_command(8000, plain, "tcp", policy)
    assert "--model-path" not in command
    assert command[command.index("--model-name") + 1] == DEFAULT_MODEL

    local = tmp_path / "weights"
    local.mkdir()
    backend = configured(SglangBackend, model_path=str(local), model_cache=str(tmp_path))
    model = backend.prepare_model(tmp_path / "model")
    assert model == Model(DEFAULT_MODEL, local)
    command = deployment.frontend_command(8000, model, "tcp", policy)
    assert command[command.index("--model-path") + 1] == str(local)
    worker = render(backend, first_case(backend, "aggregate"), tmp_path)[0]
    argv = worker["argv"]
    assert argv[argv.index("--model-path") + 1] == str(local)
    assert argv[argv.index("--served-model-name") + 1] == DEFAULT_MODEL
    # model_cache is the container's mount (its HF_HOME), never a worker variable.
    assert not [k for k in worker["env"] if k.startswith("HF_")]

    missing = configured(TrtllmBackend, model_path=str(tmp_path / "nope"))
    with pytest.raises(HandoffError, match="is not a folder"):
        missing.prepare_model(tmp_path / "model")


def test_an_unknown_model_gets_vllm_dynamo_suite_block_count(tmp_path):
    def blocks(backend):
        argv = render(backend, first_case(backend, "aggregate"), tmp_path)[0]["argv"]
        return int(argv[argv.index("--num-gpu-blocks-override") + 1])

    assert blocks(VllmBackend()) == 180  # 331,711,000 B in 16 x 114,688 B blocks
    assert blocks(configured(VllmBackend, model="org/other")) == 512


SEEDS = {
    "vllm": ({"aggregate": 290, "decode": 350, "kv_transfer": 350},
             {"aggregate": 4.8, "decode": 6.8, "kv_transfer": 6.9},
             ("requested_vllm_kv_cache_bytes", 331_711_000)),
    "sglang": ({"aggregate": 780, "decode": 780, "kv_transfer": 780},
               {"aggregate": 5.4, "decode": 8.1, "kv_transfer": 8.1},
               ("requested_sglang_kv_tokens", 1024)),
    "trtllm": ({"aggregate": 290, "decode": 350, "kv_transfer": 350},
               {"aggregate": 7.2, "decode": 10.8, "kv_transfer": 10.8},
               ("requested_trtllm_kv_tokens", 4096)),
}  # fmt: skip


@pytest.mark.parametrize("name", BACKENDS)
def test_markers_are_the_seeds_unless_the_team_sets_a_timeout(name):
    timeouts, vram, (cap_name, cap) = SEEDS[name]
    backend = BACKENDS[name]()
    for topology in GPU_TOPOLOGIES:
        markers = backend.markers(first_case(backend, topology))
        assert markers == {
            "handoff_timeout": timeouts[topology],
            "profiled_vram_gib": vram[topology],
            cap_name: cap,
        }
    team = configured(BACKENDS[name], case_timeout_s=900)
    assert team.markers(first_case(team, "decode"))["handoff_timeout"] == 900


@pytest.mark.parametrize("name", BACKENDS)
def test_without_the_engine_the_environment_check_says_what_is_missing(name):
    backend = BACKENDS[name]()
    if not missing_modules(backend.engine_module):
        pytest.skip(f"{backend.engine_module} is installed here")
    with pytest.raises(HandoffError, match=f"{backend.engine_module} is not installed"):
        backend.check_environment()


def listed(out: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """`handoff cases` output: the ids under each topology's header, and why a topology is
    not run."""
    ids: dict[str, list[str]] = {}
    skipped: dict[str, str] = {}
    current = None
    for line in out.splitlines():
        if m := re.match(r"# (\w+): not run by \w+: (.+)", line):
            skipped[m[1]], current = m[2], None
        elif m := re.match(r"# (\w+) pre_merge: ", line):
            current = m[1]
            ids[current] = []
        elif line and not line.startswith("#") and current:
            where, _, case_id = line.split()[0].partition("/")  # the key --handoff-case takes
            assert where == current, line
            ids[current].append(case_id)
    return ids, skipped


@pytest.mark.parametrize("name", BACKENDS)
def test_handoff_cases_lists_the_pre_merge_selection(name, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no team settings
    monkeypatch.delenv(plugins.ONLY_ENV, raising=False)
    monkeypatch.setattr(cli, "gpu_count", lambda: (1, ""))  # a GPU machine's default device
    plugins.load.cache_clear()
    assert cli.main(["cases", "--backend", name, "--selection", "pre_merge"]) == 0
    ids, skipped = listed(capsys.readouterr().out)
    assert {t: len(i) for t, i in ids.items()} == {"aggregate": 8, "decode": 4, "kv_transfer": 2}
    assert set(skipped) == {"prefill", *NOT_BUILT_ON_GPUS} and "prefill" in skipped["prefill"]
    assert skipped["load"] == skipped["decode_load"] == LOAD_NOT_BUILT
    assert skipped["guided"] == skipped["choices"] == skipped["abandoned"] == FIRST_ON_CPUS
    backend = BACKENDS[name]()
    # No GPU engine runs the hangs yet (DynamoGpuBackend.restrictions); TRT-LLM no drain.
    hangs = (
        "worker_stall", "drain_expired", "partition", "broker_stall", "broker_loss",
        "stall_past_lease",
    )  # fmt: skip
    not_run = hangs if name != "trtllm" else (*hangs, "graceful_shutdown")
    for t in GPU_TOPOLOGIES:
        assert ids[t] == [c.id for c in selection(t, "pre_merge", backend)]
        kept = [i for i in TOPOLOGIES[t].pre_merge_ids if not any(f in i for f in not_run)]
        assert ids[t][: len(kept)] == kept  # published rows it can run keep their ids
        assert not any(f in i for f in not_run for i in ids[t])
        if name != "trtllm":
            assert ids[t] == kept  # the seeds' pairs need no stall row
