"""A team's [tool.handoff] settings: precedence, sources, one-line errors naming key and file."""

import subprocess
import sys

import pytest

from handoff.errors import HandoffError
from handoff.settings import resolve

DEFAULTS = {"case_timeout_s": 90.0, "model": "Qwen/Qwen3-0.6B"}
INSTALLED = {"mocker", "vllm"}


def write(folder, name, text):
    (folder / name).write_text(text)
    return folder


def test_without_a_file_the_backend_defaults_hold(tmp_path):
    conf = resolve("vllm", DEFAULTS, INSTALLED, start=tmp_path)
    assert conf.get("model") == "Qwen/Qwen3-0.6B"
    assert conf.values["model"].source == "vllm backend default"
    assert conf.values["graceful_bound_s"].source == "built-in default"


def test_backend_table_beats_shared_table_and_command_line_beats_both(tmp_path):
    write(
        tmp_path,
        "pyproject.toml",
        "[tool.handoff]\ngraceful_bound_s = 3\ncase_timeout_s = 100\n"
        "[tool.handoff.vllm]\ncase_timeout_s = 400\nmax_tokens = { aggregate = 256 }\n",
    )
    cli = {"graceful_bound_s": (1.5, "--handoff-graceful-bound")}
    conf = resolve("vllm", DEFAULTS, INSTALLED, cli, tmp_path)
    assert conf.get("case_timeout_s") == 400
    assert conf.values["case_timeout_s"].source == "pyproject.toml [tool.handoff.vllm]"
    assert conf.get("max_tokens") == {"aggregate": 256}
    assert conf.get("graceful_bound_s") == 1.5
    assert conf.values["graceful_bound_s"].source == "command line --handoff-graceful-bound"


def test_an_unset_command_line_option_leaves_the_file_value(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.handoff]\ngraceful_bound_s = 3\n")
    conf = resolve("vllm", DEFAULTS, INSTALLED, {"graceful_bound_s": (None, "--x")}, tmp_path)
    assert conf.get("graceful_bound_s") == 3
    assert conf.values["graceful_bound_s"].source == "pyproject.toml [tool.handoff]"


def test_handoff_toml_holds_the_same_tables_without_the_prefix(tmp_path):
    write(tmp_path, "handoff.toml", 'model = "m"\n[vllm]\nmodel = "n"\n')
    conf = resolve("vllm", DEFAULTS, INSTALLED, start=tmp_path)
    assert conf.get("model") == "n" and conf.values["model"].source == "handoff.toml [vllm]"


def test_a_pyproject_without_a_handoff_table_is_passed_over(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.handoff]\ncase_timeout_s = 7\n")
    inner = tmp_path / "inner"
    inner.mkdir()
    write(inner, "pyproject.toml", "[project]\nname = 'x'\n")
    assert resolve("vllm", DEFAULTS, INSTALLED, start=inner).get("case_timeout_s") == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tool.handoff]\ntimeout = 3\n", "unknown key 'timeout' in [tool.handoff] of "),
        ("[tool.handoff.vllm]\nmodle = 'x'\n", "unknown key 'modle' in [tool.handoff.vllm] of "),
        ("[tool.handoff]\ncase_timeout_s = 'long'\n", "case_timeout_s in [tool.handoff] of "),
        ("[tool.handoff]\nmodel = 3\n", "must be a string, not 3"),
        ("[tool.handoff]\nmax_tokens = { aggregate = 'x' }\n", "must map topologies to integers"),
        ("[tool.handoff\n", "cannot read settings file "),
    ],
)
def test_bad_settings_name_the_key_and_the_file(tmp_path, text, message):
    write(tmp_path, "pyproject.toml", text)
    with pytest.raises(HandoffError) as caught:
        resolve("vllm", DEFAULTS, INSTALLED, start=tmp_path)
    assert message in str(caught.value)
    assert str(tmp_path / "pyproject.toml") in str(caught.value)


def test_a_key_the_backend_does_not_use_is_an_error_in_its_own_table(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.handoff.mocker]\nimage = 'x'\n")
    used = ("max_tokens", "case_timeout_s")
    with pytest.raises(HandoffError, match=r"image in \[tool.handoff.mocker\] .* does nothing"):
        resolve("mocker", {}, INSTALLED, start=tmp_path, used=used)
    # The shared table serves every backend: a key one backend ignores is no error there.
    write(tmp_path, "pyproject.toml", "[tool.handoff]\nimage = 'x'\n")
    assert "image" not in resolve("mocker", {}, INSTALLED, start=tmp_path, used=used).values


def run_config(folder, *args):
    return subprocess.run(
        [sys.executable, "-m", "handoff.cli", "config", *args],
        cwd=folder, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_handoff_config_prints_each_value_with_its_source(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.handoff.mocker]\ncase_timeout_s = 45\n")
    result = run_config(tmp_path, "--backend", "mocker")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "case_timeout_s" in line)
    assert "45" in row and "pyproject.toml [tool.handoff.mocker]" in row


def test_handoff_config_rejects_a_malformed_file_in_one_line(tmp_path):
    write(tmp_path, "pyproject.toml", "[tool.handoff]\nretries = 3\n")
    result = run_config(tmp_path, "--backend", "mocker")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "unknown key 'retries'" in result.stderr
