"""Backends come from entry points; a broken plugin or unknown backend is one clear line."""

import os
import subprocess
import sys

import pytest

from handoff import plugins
from handoff.errors import HandoffError


@pytest.fixture
def broken_plugin_path(tmp_path):
    """A distribution on sys.path whose `handoff.backends` entry point raises on import."""
    dist = tmp_path / "handoff_broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: handoff-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[handoff.backends]\nbroken = broken_plugin\n")
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    return tmp_path


def run_cli(*args, **env):
    return subprocess.run(
        [sys.executable, "-m", "handoff.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


def test_mocker_is_found_through_its_entry_point():
    plugins.load.cache_clear()
    names = [ep.name for ep in plugins.entry_points(group=plugins.GROUP)]
    assert "mocker" in names
    assert plugins.get_backend("mocker").name == "mocker"


def test_unknown_backend_lists_the_installed_ones():
    with pytest.raises(HandoffError, match=r"unknown backend 'nope' \(installed: .*mocker"):
        plugins.get_backend("nope")


def test_broken_plugin_is_one_line_and_the_others_still_work(broken_plugin_path):
    result = run_cli("backends", PYTHONPATH=str(broken_plugin_path))
    assert result.returncode == 1
    assert "mocker" in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "backend plugin 'broken' (package handoff-broken) failed to load" in lines[0]
    assert "RuntimeError: boom at import" in lines[0]
    assert "uninstall handoff-broken" in lines[0]
    cases = run_cli("cases", "--backend", "mocker", PYTHONPATH=str(broken_plugin_path))
    assert cases.returncode == 0, cases.stderr
    asked = run_cli("cases", "--backend", "broken", PYTHONPATH=str(broken_plugin_path))
    assert asked.returncode == 2
    assert "RuntimeError: boom at import" in asked.stderr and asked.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "from handoff.hookspecs import hookimpl\n"
            "@hookimpl\ndef register_backends(register):\n    register('not a backend')\n",
            "is broken: TypeError: registered str, not a handoff Backend",
        ),
        (
            "from handoff.hookspecs import hookimpl\n"
            "@hookimpl\ndef register_backends(register):\n    raise KeyError('model')\n",
            "is broken: KeyError: 'model'",
        ),
        (
            "from handoff.hookspecs import hookimpl\n"
            "@hookimpl\ndef register_backends(register, extra):\n    pass\n",
            "failed to load: PluginValidationError",
        ),
        (
            "def register_backends(register):\n    pass\n",  # no @hookimpl: pluggy ignores it
            "has no hook: LookupError: no @hookimpl register_backends(register) in broken_plugin",
        ),
    ],
)
def test_a_misbehaving_plugin_is_named_with_its_package(broken_plugin_path, body, message):
    (broken_plugin_path / "broken_plugin.py").write_text(body)
    result = run_cli("backends", PYTHONPATH=str(broken_plugin_path))
    assert result.returncode == 1
    assert "mocker" in result.stdout
    assert f"backend plugin 'broken' (package handoff-broken) {message}" in result.stderr


def test_handoff_plugins_limits_what_loads(broken_plugin_path):
    result = run_cli("backends", PYTHONPATH=str(broken_plugin_path), HANDOFF_PLUGINS="mocker")
    assert result.returncode == 0, result.stderr
    assert "mocker" in result.stdout
