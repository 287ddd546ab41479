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


def test_unknown_backend_lists_the_loaded_ones():
    with pytest.raises(HandoffError, match=r"unknown backend 'nope' \(loaded: .*mocker.*\): "):
        plugins.get_backend("nope")


def test_a_misspelt_backend_gets_the_nearest_installed_name():
    result = run_cli("cases", "--backend", "mockr")
    assert result.returncode == 2
    assert "unknown backend 'mockr'" in result.stderr
    assert "did you mean 'mocker'?" in result.stderr and "pip install" not in result.stderr


def test_a_backend_that_handoff_plugins_leaves_out_is_named_as_filtered():
    result = run_cli("cases", "--backend", "mocker", HANDOFF_PLUGINS="example")
    assert result.returncode == 2
    assert "backend 'mocker' is installed but HANDOFF_PLUGINS='example' leaves it out" in (
        result.stderr
    )


def test_handoff_plugins_that_match_nothing_is_an_error_not_an_empty_table():
    result = run_cli("backends", HANDOFF_PLUGINS="nothing-of-that-name")
    assert result.returncode == 2 and result.stdout == ""
    assert "HANDOFF_PLUGINS='nothing-of-that-name' matches no installed backend plugin" in (
        result.stderr
    )
    assert "mocker" in result.stderr


def test_a_closed_pipe_ends_a_listing_quietly():
    """`handoff cases | head -1`, with the reader gone before the first write (its end of the
    pipe closed before the command starts): no traceback, SIGPIPE's status."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "handoff.cli", "cases", "--backend", "mocker"],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr
    assert result.returncode == 141
