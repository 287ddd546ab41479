"""The `handoff` command as a user runs it."""

import subprocess

from handoff.cases import AGGREGATE_PRE_MERGE


def handoff(*args):
    return subprocess.run(["handoff", *args], capture_output=True, text=True, timeout=60)


def test_backends_lists_the_mocker_with_version_and_topologies():
    result = handoff("backends")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "mocker" in line)
    assert "0.1.0" in row and "aggregate" in row and "exact" in row


def test_cases_lists_the_pre_merge_ids_and_their_coverage():
    result = handoff("cases", "--backend", "mocker", "--selection", "pre_merge")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [c.id for c in AGGREGATE_PRE_MERGE]
    assert "pairwise coverage: complete" in result.stderr


def test_unknown_backend_and_topology_fail_in_one_line():
    for args, message in [
        (("cases", "--backend", "nope"), "unknown backend 'nope'"),
        (("cases", "--backend", "mocker", "--topology", "decode"), "does not support topology"),
    ]:
        result = handoff(*args)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and message in result.stderr
