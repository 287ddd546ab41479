"""`python -m handoff.commands.container` as the nox session runs it, on a host that cannot run the
container: each failure is real, one line on stderr, exit 2, and fast."""

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from handoff.commands.container import DOCKER_INFO_TIMEOUT_S

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--backend", "vllm", "--image", "team/vllm:1", "--", "-k", "aggregate"]
#: Python start-up and imports included; a check that waited on anything would exceed it.
FAST_S = 20.0


def run_container(*args, **env):
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "handoff.commands.container", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **env},
        timeout=60,
    )
    return result, time.monotonic() - started


def one_error_line(result):
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("handoff: error: this host cannot run the runtime container: (1) ")
    return lines[0]


def test_no_docker_binary(tmp_path):
    result, took = run_container(*ARGS, PATH=str(tmp_path))
    line = one_error_line(result)
    assert (
        "(1) docker is not on PATH: install Docker Engine and the NVIDIA Container Toolkit" in line
    )
    assert took < FAST_S


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker client binary")
def test_docker_binary_but_no_engine_answering(tmp_path):
    sock = tmp_path / "nothing-listens.sock"
    result, took = run_container(*ARGS, DOCKER_HOST=f"unix://{sock}")
    line = one_error_line(result)
    assert "(1) docker is installed but no docker engine answers (" in line
    assert str(sock) in line  # docker's own first error line, naming the socket
    assert took < DOCKER_INFO_TIMEOUT_S + FAST_S


def test_dry_run_prints_the_command_without_docker(tmp_path):
    result, took = run_container(*ARGS[:4], "--dry-run", *ARGS[4:], PATH=str(tmp_path))
    assert result.returncode == 0, result.stderr
    command = shlex.split(result.stdout)
    assert result.stdout.count("\n") == 1
    assert command[:3] == ["docker", "run", "--rm"]
    assert command[command.index("team/vllm:1") + 1 : -1] == ["bash", "-c"]
    assert command[-1].endswith("--handoff-backend vllm -k aggregate")
    assert took < FAST_S
