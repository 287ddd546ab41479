"""The runtime-container command: the docker argv, where the image and model cache come from,
and the preflight checks, each run for real (this machine and CI have no GPU)."""

import itertools
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from handoff.commands import container
from handoff.commands.container import (
    CACHE_IN_CONTAINER,
    IMAGE_ENV,
    Engine,
    Run,
    docker_command,
    handback_command,
    main,
)
from handoff.errors import HandoffError
from handoff.machine import ownership
from handoff.machine.environment import gpu_count
from handoff.machine.polling import Deadline, poll_until
from handoff.machine.ports import LEASE_DIR_ENV, PortLeases
from handoff.machine.shared import shared_folders

REPO = Path(__file__).resolve().parents[2]
RUN = Run(
    backend="vllm",
    image="registry.example/team/vllm-runtime:1.6.1",
    repo=Path("/src/handoff"),
    model_cache=Path("/data/hf"),
    pytest_args=("-k", "kv_transfer and not nats", "-n", "2"),
)
needs_docker = pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client")


def option_pairs(command):
    return list(itertools.pairwise(command))


def script_of(command):
    """The tokens of the `bash -c` script, as bash will split them."""
    assert command[-3:-1] == ["bash", "-c"]
    return shlex.split(command[-1])


def test_command_has_each_flag_mount_and_the_image_before_the_script():
    command = docker_command(RUN, environ={})
    assert command[:3] == ["docker", "run", "--rm"]
    pairs = option_pairs(command)
    for pair in [
        ("--gpus", "all"),
        ("--network", "host"),
        ("--pid", "host"),
        ("--ipc", "host"),
        ("-v", "/src/handoff:/src/handoff"),
        ("-w", "/src/handoff"),
        ("-v", f"/data/hf:{CACHE_IN_CONTAINER}"),
        ("-e", f"HF_HOME={CACHE_IN_CONTAINER}"),
    ]:
        assert pair in pairs, pair
    assert "--user" not in command and "-u" not in command
    assert command.index(RUN.image) == len(command) - 4
    assert command[command.index(RUN.image) + 1 : -1] == ["bash", "-c"]  # docker options before
    assert not any("CUDA_VISIBLE_DEVICES" in arg for arg in command)


def test_a_backend_that_needs_no_gpu_gets_no_gpus_and_every_container_a_name_and_label():
    cpu = docker_command(replace(RUN, gpus=False, name="handoff-vllm-1-2"), environ={})
    assert "--gpus" not in cpu
    pairs = option_pairs(cpu)
    assert ("--name", "handoff-vllm-1-2") in pairs
    assert ("--label", "handoff.run=handoff-vllm-1-2") in pairs
    assert ("--network", "host") in pairs and ("--pid", "host") in pairs


@pytest.mark.parametrize(
    ("args", "written"),
    [
        (["--handoff-logs", "runs", "-n", "2"], ["--handoff-logs=/work/ci/runs", "-n", "2"]),
        (["-x", "--handoff-logs=../out"], ["-x", "--handoff-logs=/work/out"]),
        (["-n", "2"], ["-n", "2"]),
    ],
)
def test_the_logs_folder_is_made_absolute_for_pytest_at_the_repository_root(args, written):
    assert container.absolute_logs(args, Path("/work/ci"))[0] == written


def test_a_logs_folder_outside_the_repository_is_mounted_and_handed_back():
    apart = replace(RUN, logs=Path("/tmp/runs"))
    pairs = option_pairs(docker_command(apart, environ={}))
    assert ("-v", "/tmp/runs:/tmp/runs") in pairs and ("-v", "/src/handoff:/src/handoff") in pairs
    assert "/tmp/runs" in handback_command(apart, uid=1000, gid=1000)
    inside = docker_command(RUN, environ={})
    assert [a for a in inside if a.startswith("/tmp/runs")] == []


def test_the_shared_folders_are_mounted_at_their_paths_named_by_their_variables_handed_back():
    shared = replace(
        RUN, shared=(("HANDOFF_PORT_LEASES", Path("/tmp/ports")), ("HANDOFF_STATE_DIR", Path("/s")))
    )
    command = docker_command(shared, environ={})
    pairs = option_pairs(command[: command.index(RUN.image)])
    for folder, name in (("/tmp/ports", "HANDOFF_PORT_LEASES"), ("/s", "HANDOFF_STATE_DIR")):
        assert ("-v", f"{folder}:{folder}") in pairs and ("-e", f"{name}={folder}") in pairs
    assert {"/tmp/ports", "/s"} <= set(handback_command(shared, uid=1000, gid=1000))
    # One folder named by both variables is mounted once: docker refuses a duplicate target.
    same = replace(RUN, shared=(("A", Path("/tmp/h")), ("B", Path("/tmp/h"))))
    assert docker_command(same, environ={}).count("/tmp/h:/tmp/h") == 1


#: The container's run on the machine's shared state, with the environment and folders that
#: `docker run` gives it: it leases its port and records a process as started, tries to lease
#: the port the host's run holds, says what it found, and holds on until told to stop.
CONTAINER_RUN = """
import os, sys
from pathlib import Path
from handoff.errors import HandoffError
from handoff.machine import ownership
from handoff.machine.ports import PortLeases
from handoff.machine.polling import Deadline, poll_until
mine, hosts, talk = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
PortLeases(range(mine, mine + 1)).take()
ownership.record(os.getpid(), "worker-in-container")
try:
    PortLeases(range(hosts, hosts + 1)).take()
    saw = "leased the host's port"
except HandoffError:
    saw = "the host's port is leased"
(talk / "said").write_text(saw)
stop = talk / "stop"
poll_until(lambda: (True if stop.exists() else None, "no stop file"), Deadline(60), "stop")
ownership.forget(os.getpid())
"""


def test_a_container_run_and_a_host_run_see_each_others_leases_and_records(tmp_path, monkeypatch):
    """The container's run (a process given the docker command's variables, the mounted
    folders being the same paths, and a temporary folder of its own) and this host's run, each
    on its default folders, share one lease folder and one record folder: neither leases the
    port the other holds, and the host sees the container's record."""
    for name in (LEASE_DIR_ENV, ownership.STATE_ENV):
        monkeypatch.delenv(name, raising=False)
    for side in ("host-tmp", "container-tmp", "talk"):
        (tmp_path / side).mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "host-tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    command = docker_command(replace(RUN, shared=tuple(shared_folders().items())), environ={})
    pairs = option_pairs(command[: command.index(RUN.image)])
    given = dict(v.split("=", 1) for k, v in pairs if k == "-e" and v.startswith("HANDOFF_"))
    assert set(given) == {LEASE_DIR_ENV, ownership.STATE_ENV}
    assert all(("-v", f"{path}:{path}") in pairs for path in given.values())  # same path inside
    inside = {**os.environ, "TMPDIR": str(tmp_path / "container-tmp"), **given}
    host, probe = PortLeases(), PortLeases()
    hosts, theirs = host.take(), probe.take()
    probe.release()  # free for the container's run to lease
    talk = tmp_path / "talk"
    argv = [sys.executable, "-c", CONTAINER_RUN, str(theirs), str(hosts), str(talk)]
    process = subprocess.Popen(argv, env=inside)
    try:
        said = talk / "said"
        poll_until(  # written whole once it exists and is not empty
            lambda: ((said.exists() and said.read_text()) or None, f"exit {process.poll()}"),
            Deadline(30), "the container's run to say what it found",
        )  # fmt: skip
        assert said.read_text() == "the host's port is leased"
        with pytest.raises(HandoffError, match=f"no free loopback port in {theirs}-{theirs}"):
            PortLeases(range(theirs, theirs + 1)).take()
        record = json.loads((ownership.records_dir() / f"{process.pid}.json").read_text())
        assert record["name"] == "worker-in-container" and record["owner"] == process.pid
    finally:
        (talk / "stop").touch()
        process.wait(30)
        host.release()
    assert process.returncode == 0


@pytest.mark.parametrize(
    ("backend", "args", "gpu"),
    [
        ("mocker", [], False),
        ("vllm", [], True),
        ("vllm", ["--handoff-device", "cpu"], False),
        ("vllm", ["-x", "--handoff-device=cpu"], False),
        ("not_installed_here", [], True),
    ],
)
def test_whether_a_backend_needs_a_gpu_is_its_plugins_answer(backend, args, gpu, tmp_path):
    assert container.needs_gpu(backend, args, tmp_path) is gpu


def test_the_handoff_packages_are_installed_before_pytest_runs():
    tokens = script_of(docker_command(RUN, environ={}))
    split = tokens.index("&&")
    pip = "python -m pip install -q -e packages/core -e packages/vllm_backend"
    recent = 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 68)'
    assert tokens[:split] == shlex.split(
        f"if python -c '{recent}' 2>/dev/null; then {pip} --no-build-isolation; else {pip}; fi"
    )
    assert tokens[split + 1 :] == [
        "exec", "python", "-m", "pytest", "--pyargs", "handoff.qualification",
        "--handoff-backend", "vllm", "-k", "kv_transfer and not nats", "-n", "2",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("setuptools", "isolated"), [("65.5.0", True), ("68.0.0", False), ("80.9.0", False)]
)
def test_the_install_builds_with_the_images_setuptools_only_where_it_is_recent(
    setuptools, isolated, tmp_path
):
    """The script's own test, run by bash against a setuptools of each version, with a pip that
    only says how it was called."""
    (tmp_path / "setuptools.py").write_text(f"__version__ = {setuptools!r}\n")
    (tmp_path / "pip.py").write_text("import sys; print(' '.join(sys.argv[1:]))\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", container.install_script("vllm")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "install", "-q", "-e", "packages/core", "-e", "packages/vllm_backend",
        *([] if isolated else ["--no-build-isolation"]),
    ]  # fmt: skip


def test_the_setuptools_the_install_needs_is_the_packages_own():
    for pyproject in sorted(REPO.glob("packages/*/pyproject.toml")):
        requires = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
        assert requires == [f"setuptools>={container.SETUPTOOLS_AT_LEAST}"], pyproject


def test_arguments_with_spaces_and_quotes_survive_both_shells():
    odd = Run(RUN.backend, RUN.image, Path("/src/my repo"), RUN.model_cache, ("-k", "it's a b"))
    command = docker_command(odd, environ={})
    assert shlex.split(shlex.join(command)) == command  # the printed line runs as built
    assert ("-v", "/src/my repo:/src/my repo") in option_pairs(command)
    assert script_of(command)[-2:] == ["-k", "it's a b"]


def test_cuda_visible_devices_passes_with_its_value_and_secrets_by_name_only():
    environ = {"CUDA_VISIBLE_DEVICES": "2,3", "HF_TOKEN": "hf_secret", "PATH": "/usr/bin"}
    command = docker_command(RUN, environ)
    before_image = command[: command.index(RUN.image)]
    assert ("-e", "CUDA_VISIBLE_DEVICES=2,3") in option_pairs(before_image)
    assert ("-e", "HF_TOKEN") in option_pairs(before_image)
    assert "hf_secret" not in shlex.join(command)
    assert not any("PATH" in arg for arg in before_image)


def test_handback_gives_only_root_owned_files_in_the_mounts_to_the_host_user():
    command = handback_command(RUN, uid=1000, gid=1001)
    image_at = command.index(RUN.image)
    assert command[image_at - 2 : image_at] == ["--entrypoint", "find"]
    assert command[image_at + 1 :] == [
        "/src/handoff/.handoff", "/src/handoff/packages", CACHE_IN_CONTAINER,
        "-user", "0", "-exec", "chown", "-h", "1000:1001", "{}", "+",
    ]  # fmt: skip
    assert ("-v", f"/data/hf:{CACHE_IN_CONTAINER}") in option_pairs(command)


@pytest.mark.parametrize(
    ("options", "maps"),
    [
        (["name=seccomp,profile=builtin", "name=cgroupns"], False),
        (["name=seccomp,profile=builtin", "name=rootless", "name=cgroupns"], True),
        (["name=userns"], True),
    ],
)
def test_rootless_and_remapped_engines_need_no_handback(options, maps):
    assert Engine("28.2.2", tuple(options)).maps_users is maps


@pytest.mark.parametrize("name", ["", "v llm", "vllm;rm", "../vllm", "1vllm", "vllm-x"])
def test_a_backend_name_that_is_not_a_plain_identifier_is_refused(name):
    with pytest.raises(HandoffError, match="not a plain identifier"):
        container.check_backend_name(name)


# --- preflight, each check for real ---------------------------------------------------------


def test_no_docker_binary_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HandoffError, match=r"^docker is not on PATH: install Docker Engine"):
        container.check_docker_binary()


@needs_docker
def test_no_docker_engine_at_the_socket_is_docker_s_own_line(tmp_path, monkeypatch):
    sock = tmp_path / "none.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    started = time.monotonic()
    with pytest.raises(HandoffError) as error:
        container.check_docker_engine()
    assert time.monotonic() - started < container.DOCKER_INFO_TIMEOUT_S
    message = str(error.value)
    assert message.startswith("docker is installed but no docker engine answers (")
    assert str(sock) in message  # docker's own first line names where it looked
    assert "DOCKER_HOST" in message and "\n" not in message


@needs_docker
def test_an_engine_that_never_answers_fails_at_the_timeout(tmp_path, monkeypatch):
    sock = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    listener.listen()  # accepts connections in the kernel, never answers
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    try:
        started = time.monotonic()
        with pytest.raises(HandoffError, match=r"answered `docker info` within 1 s at unix://"):
            container.check_docker_engine(timeout_s=1)
        assert time.monotonic() - started < 5
    finally:
        listener.close()


def test_the_gpu_check_names_nvml_when_there_is_no_gpu():
    count, why = gpu_count()
    if count:  # a GPU host: the check passes and says how many
        assert container.check_gpu() == count
        return
    with pytest.raises(HandoffError) as error:
        container.check_gpu()
    message = str(error.value)
    assert message.startswith(f"no NVIDIA GPU on this host ({why})")
    assert "NVML" in message or "driver" in message
    assert "NVIDIA Container Toolkit" in message


def test_preflight_names_everything_missing_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    if gpu_count()[0]:
        with pytest.raises(HandoffError, match=r"^this host .*: \(1\) docker is not on PATH[^;]*$"):
            container.preflight()
        return
    with pytest.raises(HandoffError) as error:
        container.preflight()
    message = str(error.value)
    assert message.startswith("this host cannot run the runtime container: (1) docker is not on")
    assert "; (2) no NVIDIA GPU on this host" in message and "\n" not in message


def test_preflight_of_a_backend_that_needs_no_gpu_does_not_ask_for_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HandoffError) as error:
        container.preflight(gpus=False)
    assert "docker is not on PATH" in str(error.value) and "GPU" not in str(error.value)


# --- image and model cache: flag > HANDOFF_IMAGE > settings ---------------------------------


@pytest.fixture
def team_repo(tmp_path, monkeypatch):
    """A repository with core, a vllm and an sglang package, and the team's settings."""
    repo = tmp_path / "repo"
    for package in ("core", "vllm_backend", "sglang_backend"):
        (repo / "packages" / package).mkdir(parents=True)
        (repo / "packages" / package / "pyproject.toml").write_text("[project]\n")
    (repo / "pyproject.toml").write_text(
        '[tool.handoff.vllm]\nimage = "team/vllm:1"\nmodel_cache = "~/hf"\n'
        '[tool.handoff.sglang]\nimage = "team/sglang:1"\n'
    )
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(IMAGE_ENV, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return repo


def test_image_precedence_flag_then_environment_then_settings(team_repo):
    resolve = container.resolve_image
    environ = {IMAGE_ENV: "env/img:2"}
    assert resolve("vllm", "flag/img:3", environ, team_repo) == ("flag/img:3", "--image")
    assert resolve("vllm", None, environ, team_repo) == ("env/img:2", IMAGE_ENV)
    assert resolve("vllm", None, {}, team_repo) == (
        "team/vllm:1",
        "pyproject.toml [tool.handoff.vllm]",
    )
    assert resolve("sglang", None, {}, team_repo)[0] == "team/sglang:1"


def test_no_image_anywhere_says_the_three_ways_to_give_one(team_repo):
    (team_repo / "pyproject.toml").write_text("[tool.handoff]\ngraceful_bound_s = 2\n")
    with pytest.raises(HandoffError, match=r"pass --image IMAGE, set HANDOFF_IMAGE, or set image"):
        container.resolve_image("vllm", None, {}, team_repo)


@pytest.mark.parametrize(
    ("flag", "environ", "message"),
    [
        ("", {}, "the image from --image is empty"),
        (None, {IMAGE_ENV: ""}, "the image from HANDOFF_IMAGE is empty"),
        ("--privileged", {}, "'--privileged' from --image is not an image reference"),
        ("a b", {}, "'a b' from --image is not an image reference"),
    ],
)
def test_an_empty_or_option_like_image_is_refused(team_repo, flag, environ, message):
    with pytest.raises(HandoffError, match=message):
        container.resolve_image("vllm", flag, environ, team_repo)


def test_model_cache_precedence_flag_then_settings_then_home(team_repo, tmp_path):
    home = tmp_path / "home"
    assert container.resolve_model_cache("vllm", "~/other", team_repo) == home / "other"
    assert container.resolve_model_cache("vllm", None, team_repo) == home / "hf"
    assert container.resolve_model_cache("sglang", None, team_repo) == home / ".cache/huggingface"


def test_dry_run_prints_the_command_from_the_team_settings(
    team_repo, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(team_repo / "packages")  # found upward, like pytest's rootdir
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker: a dry run must not need it
    leases, records = tmp_path / "leases", tmp_path / "records"
    monkeypatch.setenv(LEASE_DIR_ENV, str(leases))
    monkeypatch.setenv(ownership.STATE_ENV, str(records))
    assert main(["--backend", "vllm", "--dry-run", "--", "-k", "a b", "-x"]) == 0
    out, err = capsys.readouterr()
    repo, cache = team_repo, tmp_path / "home" / "hf"
    assert err == ""
    name = re.search(r"--name (handoff-vllm-\d+-\d{14}) ", out).group(1)
    assert out == (
        f"docker run --rm --name {name} --label handoff.run={name} "
        f"--gpus all --network host --pid host --ipc host -v {repo}:{repo} "
        f"-v {leases}:{leases} -v {records}:{records} "
        f"-w {repo} -v {cache}:/root/.cache/huggingface -e HF_HOME=/root/.cache/huggingface "
        "-e PYTHONUNBUFFERED=1 -e PIP_DISABLE_PIP_VERSION_CHECK=1 -e PIP_ROOT_USER_ACTION=ignore "
        f"-e HANDOFF_PORT_LEASES={leases} -e HANDOFF_STATE_DIR={records} "
        f"team/vllm:1 bash -c {shlex.quote(container.install_script('vllm'))[:-1]}"
        " && exec python -m pytest --pyargs handoff.qualification --handoff-backend vllm -k "
        "'\"'\"'a b'\"'\"' -x'\n"
    )
    assert not cache.exists() and not leases.exists() and not records.exists()  # creates nothing


def test_dry_run_takes_the_environment_over_settings_and_the_flag_over_both(
    team_repo, monkeypatch, capsys
):
    monkeypatch.chdir(team_repo)
    monkeypatch.setenv(IMAGE_ENV, "env/img:2")
    assert main(["--backend", "vllm", "--dry-run"]) == 0
    assert " env/img:2 bash -c " in capsys.readouterr().out
    assert main(["--backend", "vllm", "--image", "flag/img:3", "--dry-run"]) == 0
    assert " flag/img:3 bash -c " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "vllm", "--image", "", "--dry-run"], "the image from --image is empty"),
        (["--backend", "v.llm", "--image", "i", "--dry-run"], "'v.llm' is not a plain identifier"),
        (["--backend", "trtllm", "--image", "i", "--dry-run"], "use one of sglang, vllm"),
        (["--backend", "vllm", "-k", "x"], "unrecognized arguments: -k x (put pytest's arguments"),
        (["--image", "i"], "the following arguments are required: --backend"),
    ],
)
def test_input_errors_are_one_line_and_exit_2(team_repo, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(team_repo)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("handoff: error: ") and err.count("\n") == 1
    assert message in err


def test_outside_a_repository_the_error_says_where_to_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--backend", "vllm", "--image", "i", "--dry-run"]) == 2
    assert "run this from inside the repository" in capsys.readouterr().err
