"""Ctrl-C, SIGTERM and SIGKILL to a pytest run in the middle of a case (as its frontend starts,
while its stream is open, while the graceful bound runs after the SIGTERM): afterwards nothing
that handoff started is alive (etcd's members included), every leased port is free, no
discovery entry and no etcd data folder is left, and the next run starts clean."""

import json
import signal

import pytest
from interrupted_runs import IsolatedRuns

CASE = "aggregate/migration_enabled-graceful_shutdown-completion-unary-tcp"


@pytest.fixture(params=["file", "etcd"])
def runs(tmp_path, request) -> IsolatedRuns:
    backend = ["--handoff-backend", "mocker", "--handoff-discovery", request.param]
    return IsolatedRuns(tmp_path, CASE, backend, timeout_s=60)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_tears_its_case_down(runs, sig):
    run = runs.start()
    started = runs.wait_for_deployment()
    registered = runs.discovery_entries() or runs.data_folders()
    run.send_signal(sig)
    out, _ = run.communicate(timeout=60)
    assert run.returncode != 0, out[-4000:]
    assert "KeyboardInterrupt" in out or "Interrupted" in out, out[-2000:]
    runs.assert_clean(started)
    assert registered and runs.discovery_entries() == [], registered
    runs.next_run_is_clean()


STREAM = "aggregate/max_seq_len_not_exceeded-graceful_shutdown-chat-stream-tcp"


@pytest.mark.parametrize(
    ("log", "words", "phases"),
    [
        # The frontend took the case's stream: Ctrl-C while it is open (on a loaded machine
        # the log is read late, when the SIGTERM may have gone out: the stream is still open).
        (
            "frontend.log",
            ("request received", "request_type=stream"),
            {"request_sent", "holder_found", "in_flight_proven", "fault_sent"},
        ),
        # The faulted worker got its SIGTERM: Ctrl-C while the graceful bound runs.
        ("worker-*.log", ("Received shutdown signal",), {"fault_sent"}),
    ],
    ids=["stream_open", "graceful_wait"],
)
def test_ctrl_c_mid_case_tears_it_down(tmp_path, log, words, phases):
    """Ctrl-C at a moment read from the run's own logs: the case's history says where it was
    when it came (pytest's own traceback cannot always: docs/known-issues.md), its logs are
    kept, and its stream never completed."""
    runs = IsolatedRuns(tmp_path, STREAM, ["--handoff-backend", "mocker"], timeout_s=60)
    run = runs.start()
    started = runs.wait_for_log(run, log, *words)
    registered = runs.discovery_entries()
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=60)
    assert run.returncode != 0 and "KeyboardInterrupt" in out, out[-4000:]
    (history,) = runs.folders["runs"].rglob("history.json")
    events = json.loads(history.read_text())
    interrupted = next(e for e in events if e["event"] == "interrupted")
    # "signal SIGINT", or "..., swallowed where it arrived" when a finalizer took it first.
    assert interrupted["after"] in phases and interrupted["how"].startswith("signal SIGINT"), (
        interrupted
    )
    assert events[-1]["event"] == "teardown_done" and events[-1]["problems"] == []
    (frontend_log,) = history.parent.glob("frontend.log")
    assert "request completed" not in frontend_log.read_text()
    runs.assert_clean(started)
    assert registered and runs.discovery_entries() == [], registered


def test_a_killed_run_is_cleaned_up_by_the_next_one(runs):
    run = runs.start()
    started = runs.wait_for_deployment()
    folders = runs.data_folders()
    reaped = runs.kill_and_reap(run, started)
    # Every process killed, and every data folder removed; no table to delete.
    assert len(reaped) == len(started) + len(folders)
    runs.assert_clean(started)
    runs.next_run_is_clean()
