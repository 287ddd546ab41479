"""On a machine without a GPU or an engine, a GPU backend's run fails at once in one line."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_qualify_without_a_gpu_fails_at_collection_naming_what_is_missing(backend, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "handoff.cli", "qualify", "--backend", backend,
         "-p", "no:cacheprovider", "--handoff-logs", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={"PATH": "", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2, result.stdout[-2000:]
    reason = f"the {backend} backend cannot run here: no GPU ("
    lines = [line for line in result.stdout.splitlines() if line.startswith(reason)]
    assert len(lines) == 1, result.stdout[-2000:]
    assert f"nox -s {backend}_pre_merge -- --image IMAGE" in lines[0]
    if backend == "vllm":  # the one GPU backend that also runs on CPUs says where
        assert "on CPUs: nox -s vllm_cpu_pre_merge (device cpu)" in lines[0]
    assert "collected 0 items / 1 error" in result.stdout


def test_qualify_with_an_image_but_no_docker_engine_fails_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "handoff.cli", "qualify", "--backend", "vllm",
         "--image", "team/vllm-runtime:1"],
        capture_output=True, text=True, timeout=60,
        env={"PATH": str(tmp_path), "HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("handoff: error: this host cannot run the runtime container")
    assert "docker is not on PATH" in result.stderr and "no NVIDIA GPU" in result.stderr


def test_a_backend_that_takes_no_image_runs_here_even_with_one_set(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "handoff.cli", "qualify", "--backend", "mocker", "-p",
         "no:cacheprovider", "--handoff-logs", str(tmp_path), "--collect-only", "-q"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "HANDOFF_IMAGE": "team/runtime:1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "68 tests collected" in result.stdout
