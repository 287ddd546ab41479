"""A third-party backend package (tests/example_backend, installed by `nox -s tests`) is found
through its entry point and lists its cases, those of its own fault lifecycle among them
(`handoff_example.lifecycle`, found through the `handoff.lifecycles` entry point). Its cases run
end to end in test_docs_commands.py, as docs/writing-a-backend.md shows them run (every
pre-merge case, then `-k migration_enabled`), and in test_nightly.py; its own lifecycle's here,
through the one exercise, with every check."""

import subprocess
from dataclasses import replace

from handoff_example import ExampleBackend
from handoff_example.lifecycle import HANG_THEN_KILL

from handoff import faults, lifecycle, runner
from handoff.cases import KILLS, Case, selection
from handoff.runner import Settings


def run(*command):
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_it_is_discovered_with_its_own_facts():
    result = run("handoff", "backends")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "example" in line)
    assert "0.0.1" in row and "aggregate" in row and "lower_bound" in row


def test_its_cases_and_the_reason_for_the_rest():
    result = run("handoff", "cases", "--backend", "example")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    keys = [line.split()[0] for line in lines if not line.startswith("#")]
    kills = [c.key for c in selection("aggregate", "pre_merge") if c.fault in KILLS]
    assert keys[: len(kills)] == kills  # the published rows keep their ids
    own = [Case.from_id(k.removeprefix("aggregate/")).fault for k in keys[len(kills) :]]
    assert own and set(own) == {HANG_THEN_KILL.name}  # its own lifecycle's rows, added
    assert "# prefill: not run by example: the example engine has no disaggregated mode" in lines
    assert (
        "# aggregate: example runs fault worker_failure, graceful_shutdown, hang_then_kill only: "
        "the example engine has qualified its kills and its own lifecycle only"
    ) in lines


OWN_CASE = Case.from_id("migration_enabled-hang_then_kill-chat-stream-nats")


def test_its_own_lifecycle_runs_through_the_same_exercise_with_every_check(tmp_path):
    result = runner.run_case(ExampleBackend(), OWN_CASE, tmp_path, Settings(), timeout_s=60)
    assert result.verdict.passed, result.verdict.summary()
    events = {e.name: e.data for e in result.history.events}
    assert events["fault_sent"]["fault"] == "hang_then_kill"
    assert events["fault_sent"]["signal"] == "SIGSTOP"
    assert events["worker_gone"]["signals"] == ["SIGSTOP", "SIGKILL"]
    # The checks every request gets: its move, the counters, its content, every gauge at 0.
    assert {"migration_seen", "metrics_read", "gauges_idle"} <= set(events)


def test_its_lifecycle_that_leaves_the_holder_hung_fails_by_the_same_checks(tmp_path, monkeypatch):
    """Its kill left out, the holder stays stopped and unheard: the frontend (with no stream
    timeout of a stall's) never moves the request, and the exercise's silence bound fails the
    case as hung, as it would a lifecycle of handoff's own."""

    def only_hang(run, holder, watched, _aimed):
        return faults.stall(HANG_THEN_KILL.name, holder, watched, run.deadline)

    hung = replace(HANG_THEN_KILL, inject=only_hang, left=lambda *_: None)
    monkeypatch.setitem(lifecycle.registered(), HANG_THEN_KILL.name, hung)
    result = runner.run_case(ExampleBackend(), OWN_CASE, tmp_path, Settings(), timeout_s=60)
    assert not result.verdict.passed
    assert result.verdict.reasons[0].startswith("hung: no token for "), result.verdict.summary()
