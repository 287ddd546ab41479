"""A team's [tool.handoff] settings: precedence, sources, one-line errors naming key and file."""

import subprocess
import sys

import pytest

from handoff.commands import container
from handoff.errors import HandoffError
from handoff.plugins import load
from handoff.settings import KEYS, problem, resolve

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


def one_line_error(folder, text, backend="vllm", installed=INSTALLED):
    write(folder, "pyproject.toml", text)
    with pytest.raises(HandoffError) as caught:
        resolve(backend, DEFAULTS, installed, start=folder)
    message = str(caught.value)
    assert "\n" not in message and str(folder / "pyproject.toml") in message
    return message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[tool.handoff]\ngraceful_bound_s = -1\n",
            "graceful_bound_s in [tool.handoff] of {file} must be above 0, not -1: give a value "
            "above 0, or remove it",
        ),
        (
            "[tool.handoff.vllm]\ncase_timeout_s = 0\n",
            "case_timeout_s in [tool.handoff.vllm] of {file} must be above 0, not 0: give a "
            "value above 0, or remove it",
        ),
        ("[tool.handoff]\nstartup_timeout_s = -0.5\n", "must be above 0, not -0.5"),
        ("[tool.handoff]\nstartup_timeout_s = inf\n", "must be above 0, not inf"),
        ("[tool.handoff]\ncase_timeout_s = nan\n", "must be above 0, not nan"),
        ("[tool.handoff]\nspare_workers = -1\n", "must be 0 or more, not -1: give a value 0 "),
        ("[tool.handoff]\ngraceful_bound_s = true\n", "must be a number, not True"),
        (
            "[tool.handoff.vllm]\nmax_tokens = { agregate = 5 }\n",
            "max_tokens in [tool.handoff.vllm] of {file} names no topology 'agregate' in "
            "{{'agregate': 5}}: use aggregate, decode, kv_transfer, prefill, guided, choices, "
            "usage, stop, stop_after, min_tokens, frequency_penalty, presence_penalty, "
            "repetition_penalty, seeded, abandoned, load, decode_load, join, rolling, "
            "decode_race, engine_core, discovery (did you mean 'aggregate'?), "
            "or remove it",
        ),
        ("[tool.handoff]\nmax_tokens = { decode = 0 }\n", "integers above 0, not {{'decode': 0}}"),
        ("[tool.handoff]\nmax_tokens = { decode = true }\n", "integers above 0, not {{'decode'"),
    ],
)
def test_a_number_out_of_range_names_key_table_value_and_fix(tmp_path, text, message):
    file = tmp_path / "pyproject.toml"
    assert message.format(file=file) in one_line_error(tmp_path, text)


def test_the_edges_of_each_range_are_accepted(tmp_path):
    write(
        tmp_path,
        "pyproject.toml",
        "[tool.handoff]\nspare_workers = 0\ngraceful_bound_s = 0.01\nstartup_timeout_s = 1\n"
        "[tool.handoff.vllm]\nmax_tokens = { aggregate = 1, prefill = 2 }\n",
    )
    conf = resolve("vllm", DEFAULTS, INSTALLED, start=tmp_path)
    assert conf.get("spare_workers") == 0 and conf.get("graceful_bound_s") == 0.01
    assert conf.get("max_tokens") == {"aggregate": 1, "prefill": 2}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "graceful_bound_s",
            -1.0,
            "--handoff-graceful-bound must be above 0, not -1.0: give a value above 0, or leave "
            "--handoff-graceful-bound out",
        ),
        ("graceful_bound_s", 0.0, "--handoff-graceful-bound must be above 0, not 0.0: "),
        (
            "spare_workers",
            -1,
            "--handoff-spare-workers must be 0 or more, not -1: give a value 0 or more, or leave "
            "--handoff-spare-workers out",
        ),
    ],
)
def test_a_command_line_value_out_of_range_names_its_option(tmp_path, key, value, message):
    option = message.split()[0]
    with pytest.raises(HandoffError) as caught:
        resolve("vllm", DEFAULTS, INSTALLED, {key: (value, option)}, tmp_path)
    assert str(caught.value).startswith(message)


def test_a_backend_default_out_of_range_names_the_plugin(tmp_path):
    with pytest.raises(HandoffError) as caught:
        resolve("vllm", {"startup_timeout_s": 0.0}, INSTALLED, start=tmp_path)
    assert str(caught.value).startswith(
        "startup_timeout_s of the vllm backend default must be above 0, not 0.0"
    )


def test_every_installed_backend_keeps_its_defaults_in_range_and_names_known_keys():
    backends = load().backends
    assert {"mocker", "vllm", "sglang", "trtllm", "example"} <= set(backends)
    for name, backend in backends.items():
        assert set(backend.uses_settings) <= set(KEYS), name
        for defaults in (backend.defaults, *backend.device_defaults.values()):
            for key, value in defaults.items():
                assert problem(key, value) is None, (name, key, value)


@pytest.fixture
def repo(tmp_path):
    """A handoff repository with the core and two backend packages, neither installed."""
    for package in ("core", "teleport_backend", "warp_backend"):
        (tmp_path / "repo" / "packages" / package).mkdir(parents=True)
        (tmp_path / "repo" / "packages" / package / "pyproject.toml").write_text("[project]\n")
    return tmp_path / "repo"


def test_a_table_of_a_backend_package_of_the_repository_is_accepted_uninstalled(repo):
    text = "[tool.handoff.teleport]\nimage = 'team/teleport:1'\n[tool.handoff.warp]\nmodel = 'm'\n"
    write(repo, "pyproject.toml", text)
    # Host (only the mocker loaded) and container paths read the same file alike.
    conf = resolve("warp", {}, {"mocker"}, start=repo / "packages")
    assert conf.get("model") == "m"
    assert container.team_settings("teleport", repo).get("image") == "team/teleport:1"


def test_a_table_named_after_no_backend_is_an_error_with_the_nearest(repo):
    message = one_line_error(repo, "[tool.handoff.telport]\nimage = 'x'\n", "mocker", {"mocker"})
    assert message == (
        f"[tool.handoff.telport] of {repo / 'pyproject.toml'} names no backend that is installed "
        "or in this repository's packages (mocker, teleport, warp): did you mean [teleport]?"
    )


def test_outside_the_repository_only_installed_backends_have_tables(repo, tmp_path):
    message = one_line_error(tmp_path, "[tool.handoff.teleport]\nimage = 'x'\n", "mocker", set())
    assert "[tool.handoff.teleport] of " in message and "install the backend's package" in message
