"""`handoff coverage`: a selection, its promise, and the first row covering each combination."""

import re

import pytest

from handoff import cli
from handoff.cases import selection


def coverage(capsys, *args):
    code = cli.main(["coverage", *args])
    return code, capsys.readouterr().out.splitlines()


def traced(lines):
    """(combination, row number or '-') for each traceability line."""
    start = lines.index("# traceability: the first row that covers each promised combination")
    return [tuple(line.rsplit(None, 1)) for line in lines[start + 1 :]]


def test_the_aggregate_pre_merge_rows_cover_every_pair(capsys):
    code, lines = coverage(capsys, "--backend", "mocker", "--topology", "aggregate")
    assert code == 0
    assert lines[0] == "# aggregate pre_merge of mocker: 30 of 200 rows"
    assert lines[1].endswith(": holds")
    pairs = traced(lines)
    # 4 policies x 14 values of the other axes but the stall past the lease with the three
    # policies it forbids, 8 faults x 6 values of the three binary axes but the broker's two on
    # TCP (forbidden), and 3 pairs of binary axes x 4.
    assert len(pairs) == (4 * 14 - 3) + (8 * 6 - 2) + 3 * 4
    assert {row for _, row in pairs} == {str(n) for n in range(1, 31)}  # every row earns its place
    assert ("policy=migration_enabled & fault=worker_failure", "1") in pairs


def test_nightly_traces_every_triple(capsys):
    code, lines = coverage(
        capsys, "--backend", "mocker", "--topology", "kv_transfer", "--selection", "nightly"
    )
    assert code == 0
    rows = len(selection("kv_transfer", "nightly"))
    assert lines[0] == f"# kv_transfer nightly of mocker: {rows} of 16 rows"
    triples = [c for c, _ in traced(lines) if c.count("&") == 2]
    # The promise is over the 4 axes kv_transfer ids name (its policy is fixed): 4 triples of
    # axes, each with 2 x 2 x 2 values; none names the policy.
    assert len(triples) == 4 * 8
    assert not any("policy=" in c for c, _ in traced(lines))
    assert all(re.fullmatch(r"\d+", row) for _, row in traced(lines))


def test_a_topology_the_backend_does_not_run_says_why(capsys):
    with pytest.raises(SystemExit):
        cli.main(["coverage", "--backend", "mocker"])  # --topology is required
    code, _ = coverage(capsys, "--backend", "example", "--topology", "decode")
    assert code == 2
