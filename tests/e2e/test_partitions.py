"""The partition's nftables rules are removed like processes: by the case's heal, at teardown
(a case that fails while they are in place), on Ctrl-C, and by the next run after a SIGKILLed
one. A heal that never happens fails the next case by name, and a machine without nft reports
the partition cases not run, in one line, and runs the rest. They need root and nft, which
`nox -s tests` installs."""

from __future__ import annotations

import json
import re
import signal
import subprocess

from interrupted_runs import IsolatedRuns
from without_binary import not_run, run_without

from handoff.cases import Case
from handoff.machine import firewall
from handoff.machine.polling import Deadline, poll_until
from handoff.pool import Pools
from handoff.runner import Settings, run_case
from handoff_mocker import MockerBackend

CASE = "aggregate/migration_enabled-partition-chat-stream-nats"
MOCKER = ["--handoff-backend", "mocker"]


def wait_for_cut(runs: IsolatedRuns, run: subprocess.Popen[str]) -> str:
    """The run's own table, once its rules are in place."""
    mine = f"{firewall.PREFIX}{run.pid}_"

    def cut() -> tuple[str | None, list[str]]:
        if run.poll() is not None:
            raise AssertionError(f"the run ended first: {run.communicate()[0][-3000:]}")
        tables = firewall.tables()
        return next((t for t in tables if t.startswith(mine)), None), tables

    return poll_until(cut, Deadline(runs.timeout_s), f"a table {mine}* in place")


def recorded_tables(runs: IsolatedRuns) -> list[str]:
    return sorted(p.stem for p in (runs.folders["records"] / "nftables").glob("*.json"))


def test_ctrl_c_while_a_worker_is_cut_off_removes_the_rules(tmp_path):
    runs = IsolatedRuns(tmp_path, CASE, MOCKER, timeout_s=60)
    run = runs.start()
    table = wait_for_cut(runs, run)
    started = runs.recorded()
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=60)
    assert run.returncode != 0 and "KeyboardInterrupt" in out, out[-4000:]
    assert table not in firewall.tables() and recorded_tables(runs) == []
    (history,) = runs.folders["runs"].rglob("history.json")
    events = [e["event"] for e in json.loads(history.read_text())]
    assert "fault_sent" in events and "interrupted" in events  # while it was cut off
    runs.assert_clean(started)


def test_a_killed_runs_rules_are_removed_by_the_next_run(tmp_path):
    runs = IsolatedRuns(tmp_path, CASE, MOCKER, timeout_s=60)
    run = runs.start()
    table = wait_for_cut(runs, run)
    started = runs.recorded()
    reaped = runs.kill_and_reap(run, started)
    assert (
        f"handoff: deleted nftables table {table} (owner pid {run.pid}), left in place by a "
        in ("\n".join(reaped))
    )
    assert table not in firewall.tables() and recorded_tables(runs) == []
    runs.assert_clean(started)


def test_a_heal_that_never_happens_fails_the_next_case_by_name(tmp_path, monkeypatch):
    backend, pools = MockerBackend(), Pools(tmp_path / "pools")
    partition = Case.from_id(CASE.split("/")[1])
    kill = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")
    monkeypatch.setattr(firewall, "delete", lambda table: None)  # every removal fails silently
    try:
        first = run_case(backend, partition, tmp_path / "first", Settings(), 60, pools=pools)
        second = run_case(backend, kill, tmp_path / "second", Settings(), 60, pools=pools)
    finally:
        monkeypatch.undo()
        for table in firewall.own_tables():
            firewall.delete(table)
        pools.close()
    first_said = " | ".join(first.verdict.reasons)
    assert not first.verdict.passed
    assert "never routed to again" in first_said and "still in place after teardown" in first_said
    # Cut off, not gone: the frontend still lists both workers (file discovery needs no network).
    assert "the frontend lists instances {'backend/generate': 2} and models" in first_said
    assert not second.verdict.passed
    assert (
        "of an earlier case still in place: a partition was never healed"
        in (second.verdict.reasons[0])
    )
    assert firewall.own_tables() == []


def test_without_nft_the_partition_cases_are_not_run_and_the_rest_run(tmp_path):
    # A unary case: no stream, so no boundary that a loaded machine leaves not proven.
    cases = [CASE, "aggregate/max_seq_len_not_exceeded-worker_failure-completion-unary-nats"]
    done = run_without("nft", cases, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    said = not_run(done)
    assert said == [
        "handoff: 1 partition cases not run: nft is not installed: apt-get install nftables "
        "(as root)"
    ]
    assert "1 passed" in done.stdout and CASE not in done.stdout.split(said[0])[1]


class HeldUpMocker(MockerBackend):
    """The mocker, told that its re-issued request waits for the one a cut-off decode worker
    lost (as vLLM's does on Dynamo 1.6.1): its decode partition is cut in its last seconds."""

    reissue_waits_for_lost_request = True


def test_a_decode_worker_is_cut_off_in_its_responses_last_seconds(tmp_path):
    """The late cut composed with a real case: what is left at the cut fits half the stream
    timeout at the rate measured, and the request still moves and completes."""
    case = Case.from_id("migration_enabled-partition-chat-stream-nats", "decode")
    settings = Settings(stream_timeout_s=6)  # 3 s of the mocker's 3.5 s response to cut in
    result = run_case(HeldUpMocker(), case, tmp_path, settings, 120)
    assert result.verdict.passed, result.verdict.reasons
    (proof,) = [e.data["how"] for e in result.history.events if e.name == "in_flight_proven"]
    late = re.fullmatch(r".*; then (\d+) tokens, (\d+) to come at (\d+) tokens/s", proof)
    assert late, proof
    seen, rest, rate = map(int, late.groups())
    assert seen > 5 and rest <= rate * 3 and seen + rest == 600, proof
