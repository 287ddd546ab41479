"""A mixed deployment end to end, on the mocker: the processes its mix names run from the other
interpreter (here one that holds the installed release: CI has no second one; `nox -s mixed`
runs two releases), the history names them, and a mixed case that ran none of them is not
proven. The cross-release verdicts are in benchmarks/RESULTS.md."""

import sys

import pytest

from handoff import releases, runner
from handoff.cases import Case
from handoff.plugins import installed_backends
from handoff.releases import mixes
from handoff.runner import Settings
from handoff.settings import resolve
from handoff.verdict import NOT_PROVEN, PASSED
from handoff_mocker import MockerBackend

KILLED = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")


@pytest.fixture
def beside(tmp_path, monkeypatch):
    """The other release's virtualenv, as `nox -s upgrade` makes it: an interpreter of its own
    (a wrapper of this one, which holds the installed release)."""
    monkeypatch.chdir(tmp_path)
    release = releases.installed()
    python = mixes.interpreter(release)
    python.parent.mkdir(parents=True)
    ran = tmp_path / "ran"  # each module it was asked to run (`python -m MODULE ...`)
    record = f'[ "$1" = -m ] && echo "$2" >> {ran}'
    python.write_text(f'#!/bin/sh\n{record}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return release, ran


def mixed(how, release):
    """A mocker of its own with the mix (`configured_backend` would configure the one every
    other test of this xdist worker gets)."""
    backend = MockerBackend()
    overrides = {"mix": (how, "--handoff-mix"), "beside": (release, "--handoff-beside")}
    settings = resolve(
        "mocker", backend.defaults, installed_backends(), overrides, None, backend.uses_settings
    )
    backend.configure(settings)
    return backend


def ready(result):
    return next(e.data for e in result.history.events if e.name == "ready")


@pytest.mark.parametrize(
    ("how", "ran_beside", "module"),
    [
        ("alternate", ["worker-1-aggregate"], "dynamo.mocker"),
        ("frontend", ["frontend"], "dynamo.frontend"),
    ],
)
def test_the_processes_a_mix_names_run_the_other_interpreter(
    tmp_path, beside, how, ran_beside, module
):
    release, ran = beside
    result = runner.run_case(mixed(how, release), KILLED, tmp_path / "case", Settings(), 60)
    assert result.verdict.outcome == PASSED, result.verdict.summary()
    assert ready(result)["beside"] == dict.fromkeys(ran_beside, release)
    assert ran.read_text().split() == [module]  # the other interpreter ran it, and only it


def test_a_mixed_case_that_ran_no_process_of_the_other_release_is_not_proven(tmp_path, beside):
    """A rolling upgrade's replacements join a rolling restart only: a killed worker's case
    starts none, and proves nothing of the mix."""
    release, ran = beside
    result = runner.run_case(mixed("replacements", release), KILLED, tmp_path / "c", Settings(), 60)
    assert not ran.exists()
    assert result.verdict.outcome == NOT_PROVEN
    assert result.verdict.unproven == [
        f"mixed deployment: no process of it ran Dynamo {release} (replacements)"
    ]
