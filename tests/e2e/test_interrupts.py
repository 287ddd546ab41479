"""Ctrl-C, SIGTERM and SIGKILL to a pytest run in the middle of a case: afterwards nothing that
handoff started is alive, every leased port is free, and the next run starts clean."""

import signal

import pytest
from interrupted_runs import IsolatedRuns

CASE = "aggregate/migration_enabled-graceful_shutdown-completion-unary-tcp"


@pytest.fixture
def runs(tmp_path) -> IsolatedRuns:
    return IsolatedRuns(tmp_path, CASE, ["--handoff-backend", "mocker"], timeout_s=60)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_tears_its_case_down(runs, sig):
    run = runs.start()
    started = runs.wait_for_deployment()
    run.send_signal(sig)
    out, _ = run.communicate(timeout=60)
    assert run.returncode != 0, out[-4000:]
    assert "KeyboardInterrupt" in out or "Interrupted" in out, out[-2000:]
    runs.assert_clean(started)
    runs.next_run_is_clean()


def test_a_killed_run_is_cleaned_up_by_the_next_one(runs):
    run = runs.start()
    started = runs.wait_for_deployment()
    killed = runs.kill_and_reap(run, started)
    assert len(killed) == len(started)
    runs.assert_clean(started)
    runs.next_run_is_clean()
