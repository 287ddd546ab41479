"""Which processes a mixed deployment runs from the other release, and the one-line errors of a
mix that cannot be made."""

import sys
from types import SimpleNamespace

import pytest

from handoff import releases, runner
from handoff.errors import HandoffError
from handoff.pool import Pool
from handoff.releases import mixes
from handoff.verdict import NOT_PROVEN, Verdict

ARGV = [sys.executable, "-m", "dynamo.mocker", "--model-name", "m"]


@pytest.mark.parametrize(
    ("how", "beside"),
    [
        ("frontend", {("frontend", "", 0, False)}),
        ("alternate", {("worker", "aggregate", 1, False), ("worker", "prefill", 3, True)}),
        ("replacements", {("worker", "aggregate", 0, True), ("worker", "prefill", 3, True)}),
        ("prefill", {("worker", "prefill", 0, False), ("worker", "prefill", 3, True)}),
    ],
)
def test_each_mix_runs_its_processes_and_only_those_beside(how, beside):
    mix = mixes.Mix(how, "1.6.0", "/venv/bin/python")
    places = [
        ("frontend", "", 0, False),
        ("worker", "aggregate", 0, False),
        ("worker", "aggregate", 1, False),
        ("worker", "aggregate", 0, True),
        ("worker", "prefill", 0, False),
        ("worker", "prefill", 3, True),
    ]
    assert {p for p in places if mix.runs_beside(*p)} == beside


def test_a_process_run_beside_keeps_its_arguments_under_the_other_interpreter():
    mix = mixes.Mix("frontend", "1.6.0", "/venv/bin/python")
    assert mix.argv(ARGV, True) == ["/venv/bin/python", *ARGV[1:]]
    assert mix.argv(ARGV, False) == ARGV


def test_no_mix_asked_is_none():
    assert mixes.configured(None, None) is None


@pytest.mark.parametrize(
    ("how", "beside", "says"),
    [
        ("sideways", "1.6.0", "needs both --handoff-mix"),
        ("frontend", None, "needs both --handoff-mix"),
        (None, "1.6.0", "needs both --handoff-mix"),
    ],
)
def test_a_mix_half_given_fails_in_one_line(how, beside, says):
    with pytest.raises(HandoffError, match=says):
        mixes.configured(how, beside)


def test_a_release_with_no_virtualenv_names_the_session_that_makes_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HandoffError, match=r"nox -s upgrade -- \S+ 1\.6\.0. makes it"):
        mixes.configured("frontend", "1.6.0")


def fake_interpreter(release):
    """A virtualenv's interpreter for `release` that runs this one (which holds 1.6.1)."""
    python = mixes.interpreter(release)
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    mixes.release_of.cache_clear()
    return python


def test_a_process_run_beside_is_launched_as_its_own_release_says(tmp_path, monkeypatch):
    """1.5.x and 1.6.x take their loopback variables and engine arguments unlike each other:
    a worker of 1.5.1 in a 1.6.1 pool gets 1.5.1's."""
    monkeypatch.chdir(tmp_path)
    fake_interpreter("1.5.1")
    monkeypatch.setattr(mixes, "release_of", lambda python: "1.5.1")
    mix = mixes.configured("alternate", "1.5.1")
    pool = SimpleNamespace(mix=mix)
    for beside, layout, host in ((False, "sections", "127.0.0.1"), (True, "flat", "lo")):
        with Pool.launching(pool, beside):
            assert releases.current().mocker_engine_args == layout
        env = Pool.beside_env(pool, beside)
        assert env.get("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1") == host
    assert releases.current().version == releases.installed()


def test_an_interpreter_holding_another_release_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_interpreter("1.6.0")
    with pytest.raises(HandoffError, match=r"holds Dynamo 1\.6\.1, not 1\.6\.0"):
        mixes.configured("alternate", "1.6.0")


def launched(name, argv):
    return SimpleNamespace(name=name, argv=argv)


def test_a_mixed_case_that_ran_no_process_of_the_other_release_is_not_proven():
    """The mix is what such a case exists for: a replacements mix whose case started no
    replacement proved nothing of a rolling upgrade."""
    mix = mixes.Mix("replacements", "1.6.0", "/venv/bin/python")
    pool = SimpleNamespace(mix=mix, processes=[launched("worker-0-aggregate", ARGV)])
    pool.beside = lambda processes: Pool.beside(pool, processes)
    deployment = SimpleNamespace(pool=pool, frontend=launched("frontend", ARGV))
    passed = Verdict(True, [], "verdict")
    judged = runner.unmixed(passed, deployment)
    assert judged.outcome == NOT_PROVEN
    assert judged.unproven == ["mixed deployment: no process of it ran Dynamo 1.6.0 (replacements)"]
    pool.processes.append(launched("worker-2-aggregate", mix.argv(ARGV, True)))
    assert runner.ran_beside(deployment) == {"worker-2-aggregate": "1.6.0"}
    assert runner.unmixed(passed, deployment).passed
