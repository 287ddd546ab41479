"""Two independent runs at once on one machine (as two nox invocations would be) share the
machine's port leases and process records, and the same log folder, yet never collide."""

import json
import os
import subprocess
import sys

#: Unary cases: no migration boundary to leave unproven under the suite's load (the subject
#: here is two runs side by side), one on each plane, one moved and one refused.
CASES = {
    "one": "aggregate/max_seq_len_not_exceeded-worker_failure-completion-unary-nats",
    "two": "aggregate/migration_disabled-worker_failure-chat-unary-tcp",
}


def test_two_runs_at_once_both_pass_in_their_own_folders(tmp_path):
    env = {
        **os.environ,
        "HANDOFF_STATE_DIR": str(tmp_path / "records"),
        "HANDOFF_PORT_LEASES": str(tmp_path / "leases"),
    }
    runs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "--pyargs",
                "handoff.qualification",
                "-p",
                "no:cacheprovider",
                "--handoff-backend",
                "mocker",
                "--handoff-keep-logs",
                "--handoff-logs",
                str(tmp_path / "runs"),
                "--handoff-case",
                case,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, case in CASES.items()
    }
    outputs = {name: run.communicate(timeout=180)[0] for name, run in runs.items()}
    for name, out in outputs.items():
        assert runs[name].returncode == 0, out[-3000:]
        assert "1 cases: 1 passed, 0 failed" in out
        assert "left running by a run that no longer exists" not in out  # nobody reaped
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2  # one run folder each (time stamp and pid), in one log folder
    histories = [next(f.rglob("history.json")) for f in folders]
    assert histories[0].parent != histories[1].parent
    ports = [leased_ports(h) for h in histories]
    assert ports[0] and ports[1] and not ports[0] & ports[1]


def leased_ports(history) -> set[int]:
    events = json.loads(history.read_text())
    return set(next(e for e in events if e["event"] == "teardown_done")["ports"])
