"""A third-party backend package (tests/example_backend, installed by `nox -s tests`) is found
through its entry point and lists its cases. Its cases run end to end in test_docs_commands.py,
as docs/writing-a-backend.md shows them run (every pre-merge case, then `-k migration_enabled`),
and in test_nightly.py."""

import subprocess

from handoff.cases import KILLS, selection


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
    assert [line.split()[0] for line in lines if not line.startswith("#")] == [
        c.id for c in selection("aggregate", "pre_merge") if c.fault in KILLS
    ]
    assert "# prefill: not run by example: the example engine has no disaggregated mode" in lines
    assert (
        "# aggregate: example runs fault worker_failure, graceful_shutdown only: the example "
        "engine has not qualified its hangs yet"
    ) in lines
