"""The `handoff` command a run prints: one the user can type after the run, from the folder
they ran it in, whether or not the venv that holds it is on PATH."""

import os
import shutil
import sys
from pathlib import Path

from handoff.machine.environment import handoff_command

SCRIPT = Path(sys.executable).parent / "handoff"


def test_under_the_working_folder_it_is_the_relative_path(monkeypatch):
    monkeypatch.chdir(SCRIPT.parents[2])  # e.g. the repository that holds .nox/<session>
    printed = handoff_command()
    assert not Path(printed).is_absolute() and Path(printed).resolve() == SCRIPT.resolve()


def test_elsewhere_it_is_plain_handoff_only_when_path_finds_this_one(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(SCRIPT.parent))
    assert handoff_command() == "handoff"
    monkeypatch.setenv("PATH", os.defpath)
    assert shutil.which("handoff") != str(SCRIPT)
    assert handoff_command() == str(SCRIPT)
