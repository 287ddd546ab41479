"""`handoff compare` over recorded runs: every kind of difference, each with its cause, and the
exit status a regression gives."""

import json

import pytest
from rich.console import Console

from handoff import cli
from handoff.errors import HandoffError
from handoff.runs import compare
from handoff.runs.results import CaseRecord, RunResults

REFUSED = {"ongoing_request": 1, "new_request": 0, "succeeded": 0, "failed": 1}


def record(key, outcome, counts=None):
    """A case as a run records it: passed, failed, not proven ("unproven"), or a known
    defect's strict expected failure ("defect")."""
    failed = outcome in ("failed", "defect")
    return CaseRecord(
        key=key,
        passed=outcome == "passed",
        phase="verdict",
        seconds=1.0,
        reasons=["the stream carried an error frame"] if failed else [],
        counts=counts or {},
        upstream_defect="Dynamo issue 3493" if outcome == "defect" else "",
        unproven=["a boundary unseen"] if outcome == "unproven" else [],
    )


def run(tmp_path, name, dynamo, cases):
    results = RunResults("mocker", "pre_merge", str(tmp_path / name), 1.0, cases, dynamo=dynamo)
    results.write()
    return results


def test_identical_runs_show_no_difference(tmp_path):
    cases = [record("aggregate/a", "passed"), record("discovery/b", "defect")]
    assert (
        compare.compare(run(tmp_path, "a", "1.6.0", cases), run(tmp_path, "b", "1.6.1", cases))
        == []
    )


@pytest.mark.parametrize(
    ("before", "after", "worse"),
    [
        ("passed", "failed", True),
        ("defect", "failed", True),
        ("passed", "defect", True),
        ("passed", "unproven", True),
        ("defect", "passed", False),
        ("failed", "passed", False),
        ("unproven", "passed", False),
    ],
)
def test_b_proving_less_than_a_fails_the_comparison(tmp_path, before, after, worse):
    run(tmp_path, "a", "1.6.0", [record("t/x", before)])
    run(tmp_path, "b", "1.6.1", [record("t/x", after)])
    assert compare.main(tmp_path / "a", tmp_path / "b", Console(file=None)) == int(worse)


def test_a_case_b_did_not_run_or_a_b_that_ended_in_error_fails_it(tmp_path):
    run(tmp_path, "a", "1.6.0", [record("t/x", "passed"), record("t/y", "passed")])
    run(tmp_path, "b", "1.6.1", [record("t/x", "passed")])
    assert compare.main(tmp_path / "a", tmp_path / "b", Console(file=None)) == 1
    b = RunResults("mocker", "pre_merge", str(tmp_path / "c"), 1.0, [record("t/x", "passed"),
                   record("t/y", "passed")], dynamo="1.6.1", error="a worker crashed")  # fmt: skip
    b.write()
    assert compare.main(tmp_path / "a", tmp_path / "c", Console(file=None)) == 1


def test_counts_that_differ_where_no_release_changed_their_meaning_are_no_difference(tmp_path):
    """A rolling restart's moves vary with its drains' timing; its own check judged them."""
    a = run(tmp_path, "a", "1.6.0", [record("rolling/chat-nats", "passed", {"ongoing_request": 8})])
    b = run(tmp_path, "b", "1.6.1", [record("rolling/chat-nats", "passed", {"ongoing_request": 9})])
    assert compare.compare(a, b) == []


def test_flips_both_ways_and_cases_of_one_run_only(tmp_path):
    a = run(tmp_path, "a", "1.6.0", [
        record("t/regressed", "passed"), record("t/mended", "failed"),
        record("t/defect_now", "passed"), record("t/gone", "passed"),
    ])  # fmt: skip
    b = run(tmp_path, "b", "1.6.1", [
        record("t/regressed", "failed"), record("t/mended", "passed"),
        record("t/defect_now", "defect"), record("t/new", "passed"),
    ])  # fmt: skip
    kinds = {d.key: (d.before, d.after, d.kind) for d in compare.compare(a, b)}
    assert kinds == {
        "t/regressed": ("passed", "failed", compare.REGRESSION),
        "t/mended": ("failed", "passed", compare.FLIPPED),
        "t/defect_now": ("passed", "known upstream defect", compare.NEW_DEFECT),
        "t/gone": ("passed", compare.ABSENT, compare.ONLY_A),
        "t/new": (compare.ABSENT, "passed", compare.ONLY_B),
    }
    # 1.6.0 to 1.6.1 records no change: what the runs' releases do not explain is a finding.
    assert {d.key: d.cause for d in compare.compare(a, b)}["t/regressed"] == compare.NEW_FINDING


def test_counts_whose_meaning_a_release_changed_name_that_release(tmp_path):
    """1.7.1 (on paper) counts a refused move no more: the same verdict, other counts."""
    a = run(tmp_path, "a", "1.6.1", [record("aggregate/refused", "passed", REFUSED)])
    b = run(tmp_path, "b", "1.7.1", [
        record("aggregate/refused", "passed", {**REFUSED, "ongoing_request": 0})
    ])  # fmt: skip
    (difference,) = compare.compare(a, b)
    assert difference.kind == compare.MEANING
    assert difference.cause.startswith("1.7.1: 1.7.1's release notes: the migration counter")


def test_a_fix_that_a_release_records_is_its_cause(tmp_path, monkeypatch):
    fixed = compare.releases.Change("fixed", frozenset({"Dynamo issue 3493"}), "PR 1: leases heal")
    release = compare.releases.Release("1.6.1", (fixed,))
    monkeypatch.setattr(
        compare.releases,
        "RELEASES",
        tuple(release if r.version == "1.6.1" else r for r in compare.releases.RELEASES),
    )
    a = run(tmp_path, "a", "1.6.0", [record("discovery/healed", "defect")])
    b = run(tmp_path, "b", "1.6.1", [record("discovery/healed", "passed")])
    (difference,) = compare.compare(a, b)
    assert (difference.kind, difference.cause) == (compare.FIX_ARRIVED, "1.6.1: PR 1: leases heal")


def test_the_command_exits_1_on_a_regression_and_adds_a_section_to_b_report(tmp_path, capsys):
    run(tmp_path, "a", "1.6.0", [record("t/x", "passed")])
    run(tmp_path, "b", "1.6.1", [record("t/x", "failed")])
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "t/x" in out and compare.REGRESSION.split(":")[0] in out
    assert 'id="compare"' in (tmp_path / "b" / "report.html").read_text()
    run(tmp_path, "c", "1.6.1", [record("t/x", "passed")])
    assert compare.main(tmp_path / "a", tmp_path / "c", Console(file=None)) == 0


def test_runs_of_different_selections_are_refused_in_one_line(tmp_path):
    a = run(tmp_path, "a", "1.6.1", [])
    b = RunResults("mocker", "nightly", str(tmp_path / "b"), 1.0, [], dynamo="1.6.1")
    with pytest.raises(HandoffError, match="compare two runs of one backend's selection"):
        compare.compare(a, b)


def test_a_run_recorded_before_runs_named_their_release_still_loads(tmp_path):
    results = run(tmp_path, "a", "", [record("t/x", "passed")])
    data = json.loads((tmp_path / "a" / "results.json").read_text())
    data.pop("dynamo")
    (tmp_path / "a" / "results.json").write_text(json.dumps(data))
    assert RunResults.load(tmp_path / "a").dynamo == "" == results.dynamo


def test_the_changes_between_two_releases_are_listed_beside_the_verdicts(tmp_path, capsys):
    """1.5.1 and 1.6.1 judge the same case by their own entries: no verdict differs, and the
    changes the releases between made are listed, each with its cause."""
    run(tmp_path, "a", "1.5.1", [record("t/x", "passed")])
    run(tmp_path, "b", "1.6.1", [record("t/x", "passed")])
    assert compare.main(tmp_path / "a", tmp_path / "b", Console(file=None, width=300)) == 0
    out = capsys.readouterr().out
    assert "no difference" in out and "refusal_code" in out and "mocker_engine_args" in out
    assert "refusal_code" in (tmp_path / "b" / "report.html").read_text()
