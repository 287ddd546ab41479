"""The CPU device's disaggregated workers create NIXL agents without a progress thread
(handoff_vllm/nixl_polled), and a `sitecustomize` of the environment still runs. Checked in a
fresh interpreter against a stand-in `nixl_cu12` that keeps NIXL's configuration signature;
tests/vllm_cpu runs the real one."""

from __future__ import annotations

import os
import subprocess
import sys

from handoff_vllm import cpu

AGENT_API = """
class nixl_agent_config:
    def __init__(self, enable_prog_thread=True, num_threads=0, capture_telemetry=False):
        self.enable_pthread = enable_prog_thread
        self.num_threads = num_threads
"""
READ = (
    "from nixl_cu12._api import nixl_agent_config as c;"
    "print(c(num_threads=4).enable_pthread, c().num_threads)"
)


def interpreter(tmp_path, *path) -> str:
    (tmp_path / "nixl_cu12").mkdir(exist_ok=True)
    (tmp_path / "nixl_cu12" / "__init__.py").write_text("")
    (tmp_path / "nixl_cu12" / "_api.py").write_text(AGENT_API)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), str(tmp_path)])}
    run = subprocess.run([sys.executable, "-c", READ], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_the_agent_configuration_has_no_progress_thread(tmp_path):
    assert interpreter(tmp_path) == ["True", "0"]  # the stand-in, as NIXL builds it
    assert interpreter(tmp_path, cpu.NIXL_POLLED) == ["False", "0"]


def test_the_environment_s_own_sitecustomize_still_runs(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    marker = tmp_path / "ran"
    (own / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert interpreter(tmp_path, cpu.NIXL_POLLED, own) == ["False", "0"]
    assert marker.exists()
