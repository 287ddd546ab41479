"""The vLLM backend's second device, checked without vLLM: the CPU workers' command lines
against a reviewed golden and Dynamo's own flag definitions, the `device` setting from every
source, and the built-in model's recipe. The same workers run for real in tests/vllm_cpu
(nox -s vllm_cpu_tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_gpu_backends import (
    GOLDEN,
    GPU_TOPOLOGIES,
    NATIVE,
    configured,
    dynamo_parser,
    first_case,
    flags,
    golden_view,
    hosts,
    ports_in,
    render,
)

from handoff import cli, plugins, word_tokenizer
from handoff.cases import (
    DRAINS,
    KILLS,
    SAMPLINGS,
    Case,
    backend_cases,
    backend_restriction,
    selection,
)  # fmt: skip
from handoff.errors import HandoffError
from handoff.machine import services
from handoff.machine.environment import missing_modules
from handoff.settings import Configuration, Setting
from handoff_vllm import VllmBackend, cpu, tiny_model

#: The engine-native flags of a CPU worker: the GPU worker's, less the GPU-only ones, plus
#: the model inside the engine process.
GPU_ONLY = {"--num-gpu-blocks-override", "--gpu-memory-utilization"}
CPU_ONLY = {"--distributed-executor-backend", "--dtype"}
CPU_NATIVE = {**NATIVE["vllm"], "all": NATIVE["vllm"]["all"] - GPU_ONLY | CPU_ONLY}


@pytest.fixture
def tiny(monkeypatch, tmp_path) -> Path:
    """The built-in model's folder, as if made: these tests read launch facts, not weights."""
    folder = tmp_path / "tiny-model"
    monkeypatch.setattr(tiny_model, "ensure", lambda seed=0, root=None: folder)
    return folder


def on_cpu(**settings: object) -> VllmBackend:
    return configured(VllmBackend, device="cpu", **settings)


def test_cpu_worker_launches_match_the_reviewed_golden(tiny, tmp_path, monkeypatch):
    """A change here is a change to what runs on vLLM's CPU build: review it, then update
    tests/unit/golden/vllm_cpu.json. A disaggregated worker inherits the caller's PYTHONPATH
    after its own (`nixl_polled`): none here."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    view = golden_view(on_cpu(), tmp_path / "cases")
    text = json.dumps(view, indent=2).replace(str(tiny), "<tiny model>")
    text = text.replace(str(cpu.NIXL_POLLED), "<nixl_polled>")
    assert json.loads(text) == json.loads((GOLDEN / "vllm_cpu.json").read_text())


def test_on_cuda_nothing_changes(tmp_path):
    """The device setting, when it says cuda, gives the very launches of the GPU golden."""
    expected = json.loads((GOLDEN / "vllm.json").read_text())
    assert golden_view(configured(VllmBackend, device="cuda"), tmp_path) == expected


@pytest.mark.parametrize("topology", GPU_TOPOLOGIES)
@pytest.mark.parametrize("plane", ["nats", "tcp"])
def test_cpu_workers_pass_dynamo_its_flags_and_no_gpu_flag(
    topology, plane, dynamo_groups, tiny, tmp_path
):
    backend = on_cpu()
    case = next(c for c in selection(topology, "nightly", backend) if c.plane == plane)
    for worker in render(backend, case, tmp_path):
        argv = worker["argv"][3:]
        args, leftover = dynamo_parser(dynamo_groups, "vllm").parse_known_args(argv)
        assert flags(leftover) == CPU_NATIVE["all"] | CPU_NATIVE.get(worker["role"], set())
        assert args.request_plane == plane and "--discovery-backend" not in argv
        assert argv[argv.index("--block-size") + 1] == "32"  # CPU attention: a multiple of 32
        # Not vLLM's CPU default, bfloat16, whose rounding would hide the context's fingerprint.
        assert argv[argv.index("--dtype") + 1] == "float32"
        # The model runs in the engine process: no busy-polled queue to a VLLM::Worker.
        assert argv[argv.index("--distributed-executor-backend") + 1] == "uni"
        assert argv[argv.index("--model") + 1] == str(tiny)
        env = worker["env"]
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
        assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # else `uni` becomes `mp` on CPUs
        if worker["role"] != "aggregate":
            connector = json.loads(argv[argv.index("--kv-transfer-config") + 1])
            assert connector["kv_buffer_device"] == "cpu"
        assert set(hosts(worker)) <= {services.LOOPBACK}
        assert ports_in(worker) == set(worker["ports"].values())


def test_the_cpu_runs_what_the_gpu_runs_and_load(tiny):
    backend = on_cpu()
    assert list(VllmBackend().topologies) == list(GPU_TOPOLOGIES)
    aggregate = ("aggregate", "aggregate")
    assert backend.topologies == {
        **VllmBackend().topologies,
        "load": aggregate,
        "guided": aggregate,
        "abandoned": aggregate,
        "decode_race": ("prefill", "decode", "decode"),
        "engine_core": aggregate,
        "join": aggregate,
        "rolling": aggregate,
        "usage": aggregate,
        "stop": aggregate,
        "stop_after": aggregate,
        "min_tokens": aggregate,
        "frequency_penalty": aggregate,
        "presence_penalty": aggregate,
        "repetition_penalty": aggregate,
        "seeded": aggregate,
    }
    assert "one sequence at a time" in backend.why_not("choices")
    assert "not measured there" in backend.why_not("decode_load")
    assert "mocker and on vLLM's CPU engine" in VllmBackend().why_not("load")


def test_a_cpu_load_case_leaves_requests_queued_on_the_worker_it_faults(tiny, tmp_path):
    """Four requests on two workers that decode one at a time: whichever worker holds the
    most holds one queued, and each worker is launched with that limit."""
    backend = on_cpu()
    case = first_case(backend, "load")
    assert backend.setting("load_requests") == cpu.LOAD_REQUESTS == 4
    assert backend.decoding_at_once(case) == 1
    assert backend.decoding_at_once(first_case(backend, "aggregate")) is None
    workers = len(backend.roles("load"))
    assert -(-cpu.LOAD_REQUESTS // workers) > backend.decoding_at_once(case)
    for worker in render(backend, case, tmp_path):
        assert worker["argv"][worker["argv"].index("--max-num-seqs") + 1] == "1"


def test_the_cpu_runs_the_stall_and_partition_where_the_gpu_runs_kills(tiny):
    """The hangs run in aggregate and decode on the CPU engine, with its own stream timeout;
    the lifecycles qualified on the mocker only are named, not run."""
    faults = {t: {c.fault for c in selection(t, "pre_merge", on_cpu())} for t in ("aggregate",
              "decode", "kv_transfer", "load")}  # fmt: skip
    assert faults["aggregate"] == faults["decode"] == {*KILLS, "worker_stall", "partition"}
    assert faults["kv_transfer"] == faults["load"] == set(KILLS)
    on_gpu = {c.fault for c in selection("aggregate", "pre_merge", VllmBackend())}
    assert on_gpu == set(KILLS)
    everywhere, under_load, sampled = on_cpu().restrictions
    assert "drain_expired" not in everywhere.allowed and "qualified on the mocker" in everywhere.why
    assert everywhere.holds_in("load") and everywhere.holds_in("decode")
    assert under_load.holds_in("load") and not under_load.holds_in("aggregate")
    assert "discovery lease" in under_load.why
    assert sampled.holds_in("seeded") and not sampled.holds_in("aggregate")
    assert [len(selection(t, "pre_merge", on_cpu())) for t in faults] == [16, 8, 2, 4]


def test_the_cpu_waits_longer_for_a_silent_stream_unless_the_team_says(tiny):
    """A move's re-issued prefill on the CPU engine can outlast the GPU's 3 s timeout."""
    assert on_cpu().setting("stream_timeout_s") == cpu.STREAM_TIMEOUT_S > 3
    assert VllmBackend().setting("stream_timeout_s") == 3
    assert on_cpu(stream_timeout_s=7).setting("stream_timeout_s") == 7


def test_cpu_requests_are_words_of_the_tiny_model(tiny):
    """The anchor, then one word a token: the prompt is exactly its planned tokens."""
    backend = on_cpu()
    for topology in backend.topologies:
        for case in selection(topology, "nightly", backend):
            shape = backend.shape(case)
            assert word_tokenizer.count(shape.prompt) == shape.prompt_tokens
            assert shape.prompt_tokens + shape.max_tokens <= cpu.CONTEXT_TOKENS
    # The transfer's 823-token prefix leaves room for an output that outlasts a late harness.
    assert (
        backend.shape(first_case(backend, "kv_transfer")).max_tokens
        == cpu.OUTPUT_TOKENS["kv_transfer"]
    )
    assert backend.output_tokens(" t5 t6 t7") == 3
    assert VllmBackend().output_tokens(" t5 t6") is None  # a real tokenizer: not counted


def test_every_topology_the_cpu_runs_has_its_lengths_and_timeout():
    """A topology added to the CPU's runs without its row here would fail only when a case
    of it runs (at its pool's start, or later)."""
    ran = set(on_cpu().topologies)
    for table in (cpu.OUTPUT_TOKENS, cpu.OUTPUT_SECONDS, cpu.TIMEOUTS):
        assert ran <= set(table)


def test_cpu_markers_cpu_timeouts_and_no_gpu_memory(tiny):
    backend = on_cpu()
    for topology in GPU_TOPOLOGIES:
        assert backend.markers(first_case(backend, topology)) == {
            "handoff_timeout": cpu.TIMEOUTS[topology],
            "requested_vllm_kv_cache_bytes": 2**30,
        }
    assert backend.cpus_per_case == cpu.CPUS_PER_CASE
    assert backend.setting("startup_timeout_s") == cpu.STARTUP_TIMEOUT_S
    assert on_cpu(startup_timeout_s=42.0).setting("startup_timeout_s") == 42.0  # team wins


def test_a_model_path_replaces_the_tiny_model_on_the_cpu(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    backend = on_cpu(model_path=str(weights), model="org/real")
    model = backend.prepare_model(tmp_path / "model")
    assert (model.name, model.path) == ("org/real", weights)
    assert backend.output_tokens(" t5") is None


def settings_file(folder: Path, text: str) -> None:
    (folder / "pyproject.toml").write_text(f"[tool.handoff.vllm]\n{text}\n")


@pytest.fixture
def team(monkeypatch, tmp_path) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(plugins.ONLY_ENV, raising=False)
    plugins.load.cache_clear()
    return tmp_path


def test_the_device_comes_from_settings_under_the_command_line(team, tiny, capsys):
    assert plugins.configured_backend("vllm").device == "cuda"
    settings_file(team, 'device = "cpu"')
    backend = plugins.configured_backend("vllm")
    assert backend.device == "cpu"
    assert backend.configuration.values["device"].source == "pyproject.toml [tool.handoff.vllm]"
    flagged = plugins.configured_backend("vllm", {"device": ("cuda", "--handoff-device")})
    assert flagged.device == "cuda"
    assert cli.main(["config", "--backend", "vllm"]) == 0
    assert "pyproject.toml [tool.handoff.vllm]" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("gpus", "device", "source"),
    [
        (0, "cpu", "this machine: no NVIDIA driver answers"),
        (1, "cuda", "vllm backend default"),
    ],
)
def test_handoff_cases_defaults_to_the_device_the_machine_has(
    team, tiny, capsys, monkeypatch, gpus, device, source
):
    monkeypatch.setattr(cli, "gpu_count", lambda: (gpus, "no NVIDIA driver answers"))
    assert cli.main(["cases", "--backend", "vllm"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"# device: {device} (from {source}); --device picks another"
    session = {"cpu": "vllm_cpu_pre_merge", "cuda": "vllm_pre_merge"}[device]
    assert f"# run by: nox -s {session}" in out


def test_a_device_named_asks_nothing_of_the_driver(team, tiny, capsys, monkeypatch):
    monkeypatch.setattr(cli, "gpu_count", lambda: pytest.fail("NVML asked with a device named"))
    assert cli.main(["cases", "--backend", "vllm", "--device", "cuda"]) == 0
    assert capsys.readouterr().out.startswith("# device: cuda (from command line --device)")


def test_a_device_chosen_is_kept_on_a_machine_without_a_gpu(team, tiny, capsys, monkeypatch):
    monkeypatch.setattr(cli, "gpu_count", lambda: (0, "no NVIDIA driver answers"))
    settings_file(team, 'device = "cuda"')
    assert cli.main(["cases", "--backend", "vllm", "--selection", "nightly"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# device: cuda (from pyproject.toml [tool.handoff.vllm])")
    assert "# run by: nox -s vllm_pre_merge -- --handoff-selection nightly" in out


def test_handoff_cases_shows_the_device_and_what_each_runs(team, tiny, capsys):
    assert cli.main(["cases", "--backend", "vllm", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# device: cpu (from command line --device); --device picks another"
    assert out[1].startswith("#   cuda: GPUs") and out[2].startswith("#   cpu: CPUs")
    assert "handoff_timeout=120 requested_vllm_kv_cache_bytes=1073741824" in "\n".join(out)


@pytest.mark.parametrize(
    ("backend", "where", "message"),
    [
        ("vllm", 'device = "tpu"', "device 'tpu' (pyproject.toml [tool.handoff.vllm]) is not one "
         "the vllm backend runs on: use cuda or cpu"),
        ("mocker", "--device cpu", "device 'cpu' (command line --device) is not one the mocker "
         "backend runs on: it has one device"),
        ("vllm", 'device = 1', "device in [tool.handoff.vllm] of"),
    ],
)  # fmt: skip
def test_a_bad_device_is_one_line_and_exit_2(team, capsys, backend, where, message):
    argv = ["cases", "--backend", backend]
    if where.startswith("--"):
        argv += where.split()
    else:
        settings_file(team, where)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_without_vllm_the_cpu_device_names_its_session():
    if not missing_modules("vllm"):
        pytest.skip("vllm is installed here: tests/vllm_cpu runs it")
    with pytest.raises(HandoffError, match="nox -s vllm_cpu_pre_merge") as raised:
        on_cpu().check_environment()
    assert "vllm" in str(raised.value) and "GPU" not in str(raised.value)
    with pytest.raises(HandoffError, match="on CPUs: nox -s vllm_cpu_pre_merge"):
        VllmBackend().check_environment()


def test_the_model_folder_is_named_by_its_recipe(tmp_path):
    zero, one = tiny_model.folder_for(0, tmp_path), tiny_model.folder_for(1, tmp_path)
    assert zero != one and zero.parent == one.parent == tmp_path / "models"
    assert zero == tiny_model.folder_for(0, tmp_path)
    assert zero.name.startswith(tiny_model.NAME)


def test_without_torch_making_the_model_fails_in_one_message(tmp_path):
    """The maker runs in a child, so the harness never imports torch; where torch is missing
    (the tests session) the error says what it needs and which session installs it."""
    if not missing_modules("torch"):
        pytest.skip("torch is installed here: tests/vllm_cpu makes the model for real")
    with pytest.raises(HandoffError, match="needs torch and transformers") as raised:
        tiny_model.ensure(0, tmp_path)
    assert "nox -s vllm_cpu_pre_merge" in str(raised.value)
    assert not tiny_model.folder_for(0, tmp_path).exists()  # nothing half-made left


def test_configure_keeps_a_team_default_over_the_device_default():
    values = {
        "device": Setting("cpu", "test"),
        "startup_timeout_s": Setting(99.0, "pyproject.toml [tool.handoff]"),
    }
    backend = VllmBackend()
    backend.configure(Configuration("vllm", values))
    assert backend.setting("startup_timeout_s") == 99.0
    assert backend.setting("model") == tiny_model.NAME


def test_the_cpu_device_keeps_one_aggregate_spare_and_never_a_disaggregated_one():
    aggregate = Case.from_id("migration_enabled-worker_failure-chat-stream-nats")
    decode = Case.from_id("migration_enabled-worker_failure-chat-stream-nats", "decode")
    assert on_cpu().spare_workers(aggregate) == 1
    assert on_cpu().configuration.values["spare_workers"].source == "vllm backend default on cpu"
    assert on_cpu(spare_workers=3).spare_workers(aggregate) == 3
    assert on_cpu().spare_workers(decode) == on_cpu(spare_workers=2).spare_workers(decode) == 0
    assert VllmBackend().spare_workers(decode) == 1  # on a GPU: the built-in default


def test_a_drain_on_the_cpu_has_room_for_the_run_its_sigterm_allows(team, tiny):
    """512 tokens left a drain's 2 s wait without its room at this engine's pace (a missed
    window): every pre-merge CPU drain case asks for the drain's length at least."""
    backend = plugins.configured_backend("vllm", {"device": ("cpu", "--device")})
    drains = [c for c in backend_cases(backend, None, "pre_merge") if c.fault in DRAINS]
    assert drains
    short = [c.key for c in drains if backend.shape(c).max_tokens < cpu.DRAIN_TOKENS]
    assert short == []


def test_a_sampled_drain_is_not_run_on_the_cpu_and_says_why(team, tiny):
    backend = plugins.configured_backend("vllm", {"device": ("cpu", "--device")})
    drained = Case.from_id("graceful_shutdown-chat-unary-tcp", "repetition_penalty")
    assert backend_restriction(backend, drained).why == cpu.SAMPLED_KILLS_ONLY
    nightly = [c for t in SAMPLINGS for c in selection(t, "nightly", backend)]
    assert nightly and {c.fault for c in nightly} == {"worker_failure"}
