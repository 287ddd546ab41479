"""The fourth outcome: a case whose central check could not be made is not proven. Counted and
shown everywhere a verdict goes (the verdict's summary, results.json, the tables, report.html,
JUnit, the tally, the exit status), never a pass, and it fails the run unless the run allows it
(`--handoff-allow-unproven`, which reports it as skipped)."""

import json
import xml.etree.ElementTree as ET
from html import escape
from pathlib import Path

import pytest
from test_known_defects import DRAINED
from test_verdict import streamed

from handoff.cli import main
from handoff.commands.nightly import junit_counts
from handoff.faults import FaultReport
from handoff.history import History
from handoff.metrics import MigrationCounts
from handoff.policies import KNOWN_DEFECTS, OUTCOMES
from handoff.runner import CaseResult
from handoff.runs.progress import LiveProgress
from handoff.runs.results import CaseRecord, RunResults, tally
from handoff.verdict import (
    FAILED,
    KNOWN_DEFECT,
    NOT_PROVEN,
    PASSED,
    Verdict,
    against_known_defect,
    judge,
)

pytest_plugins = ["pytester"]

UNMADE = "whether a token was lost at the migration: where worker-1's tokens begin is ambiguous"
DRAIN = KNOWN_DEFECTS["drain_expired"]
SIGKILL = FaultReport("worker_failure", "worker-0", 1, ("SIGKILL",), False)
ENABLED = OUTCOMES[("decoding", "migration_enabled")]


def judged(tokens: int = 8, unproven=(UNMADE,)) -> Verdict:
    counts = MigrationCounts(1, 0, 0, 1, 0)
    return judge(ENABLED, "migration_enabled", streamed(tokens), counts, SIGKILL, 8, "exact",
                 unproven=unproven)  # fmt: skip


def test_a_check_not_made_is_not_proven_never_a_pass():
    verdict = judged()
    assert not verdict.passed and verdict.reasons == []
    assert verdict.outcome == NOT_PROVEN
    assert verdict.summary() == f"NOT PROVEN: {UNMADE}"
    assert judged(unproven=()).outcome == PASSED


def test_a_failure_outranks_a_check_not_made_and_names_it_too():
    verdict = judged(tokens=5)
    assert verdict.outcome == FAILED
    assert verdict.summary().startswith("FAIL in verdict: 5 completion tokens in usage")
    assert verdict.summary().endswith(f"; not proven besides: {UNMADE}")


def test_a_verdict_that_says_it_passed_with_a_check_not_made_is_not_proven():
    assert Verdict(True, [], "verdict", unproven=[UNMADE]).outcome == NOT_PROVEN


def test_a_known_defect_with_a_check_not_made_is_not_proven():
    """The defect's xfail says every other promise held: an unmade check cannot say so."""
    reasons = DRAINED["aggregate/migration_enabled-drain_expired-chat-stream-nats"]
    witnessed = {DRAIN.witness.key: (True, "read")}
    unmade = Verdict(False, reasons, "verdict", unproven=[UNMADE], witnessed=dict(witnessed))
    verdict = against_known_defect(unmade, DRAIN)
    assert verdict.upstream_defect and verdict.outcome == NOT_PROVEN
    alone = Verdict(False, list(reasons), "verdict", witnessed=dict(witnessed))
    assert against_known_defect(alone, DRAIN).outcome == KNOWN_DEFECT


def test_a_defect_that_showed_in_no_check_made_has_its_fix():
    verdict = against_known_defect(judged(), DRAIN)
    assert verdict.outcome == FAILED
    assert verdict.reasons[0].startswith(f"passed, but {DRAIN.issue} was expected to fail")
    assert verdict.unproven == [UNMADE]


def record(key: str, verdict: Verdict, folder: Path) -> CaseRecord:
    from handoff.cases import Case

    topology, case_id = key.split("/")
    result = CaseResult(Case.from_id(case_id, topology), verdict, 1.0, folder / key, History())
    return CaseRecord.of(result)


def test_records_count_and_show_each_outcome(tmp_path):
    cases = [
        record("aggregate/migration_enabled-worker_failure-chat-stream-tcp", judged(), tmp_path),
        record("aggregate/migration_enabled-worker_failure-chat-stream-nats",
               judged(unproven=()), tmp_path),
        record("aggregate/migration_enabled-worker_failure-chat-unary-tcp", judged(5), tmp_path),
    ]  # fmt: skip
    back = [CaseRecord.from_json(c.to_json()) for c in cases]  # results.json, read back
    assert [c.verdict for c in back] == ["NOT PROVEN", "PASS", "FAIL in verdict"]
    assert [c.failed for c in back] == [False, False, True]
    assert back[0].unproven == [UNMADE]
    assert tally(back) == "3 cases: 1 passed, 1 failed, 1 not proven"


def write_run(tmp_path: Path, allow: bool) -> Path:
    run = tmp_path / "run"
    key = "aggregate/migration_enabled-worker_failure-chat-stream-tcp"
    case = record(key, judged(), run)
    RunResults("mocker", "pre_merge", str(run), 3.0, [case], allow_unproven=allow).write()
    return run


@pytest.mark.parametrize(("allow", "code"), [(False, 1), (True, 0)])
def test_the_report_shows_the_checks_not_made_and_fails_unless_the_run_allowed_it(
    tmp_path, capsys, allow, code
):
    run = write_run(tmp_path, allow)
    assert main(["report", str(run)]) == code
    lines = capsys.readouterr().out.splitlines()
    key = "aggregate/migration_enabled-worker_failure-chat-stream-tcp"
    assert any(key in line and "NOT PROVEN" in line for line in lines)  # the table
    assert f"NOT PROVEN {key}" in lines
    assert f"  not proven: {UNMADE}" in lines
    assert "1 cases: 0 passed, 0 failed, 1 not proven" in lines
    page = (run / "report.html").read_text()
    assert '<td class="unproven">NOT PROVEN</td>' in page
    assert '<div class="unmade">' in page and escape(UNMADE) in page


def test_the_live_progress_counts_not_proven_apart_from_failed():
    progress = LiveProgress()
    progress.total = 2
    progress.started("a")
    progress.started("b")
    progress.finished("a", passed=False, unproven=True)
    progress.finished("b", passed=False)
    assert "1 failed, 1 not proven" in progress.render().plain


def test_the_nightly_counts_cases_not_proven_that_the_run_allowed(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase name="a"/>'
        '<testcase name="b"><skipped type="pytest.skip" message="not proven: why"/></testcase>'
        '<testcase name="c"><skipped type="pytest.xfail" message="Dynamo issue 13952"/>'
        '</testcase><testcase name="d"><failure message="NOT PROVEN: why"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert junit_counts(junit) == (1, 1, 1)


# --- the pytest option, on a qualification run whose case is not proven ---------------------

CASE = "aggregate/migration_enabled-worker_failure-chat-stream-nats"


@pytest.fixture
def qualify(pytester, monkeypatch, tmp_path):
    """An in-process qualification run of one case whose runner says it is not proven."""

    def run_case(backend, case, folder, settings, timeout_s, pools=None):
        return CaseResult(case, judged(), 0.1, folder, History())

    def go(*args: str):
        # The inner run may import the suite's module afresh: patch the runner it imports too.
        monkeypatch.setattr("handoff.runner.run_case", run_case)
        monkeypatch.setattr("handoff.qualification.run_case", run_case)
        logs = tmp_path / f"runs{len(args)}"
        result = pytester.runpytest_inprocess(
            "--pyargs", "handoff.qualification", "-p", "no:cacheprovider", "-p", "no:anyio",
            "-p", "no:hypothesispytest", "--handoff-backend", "mocker", "--handoff-fresh",
            "--handoff-logs", str(logs), "--handoff-case", CASE, *args,
        )  # fmt: skip
        return result, next(logs.iterdir())

    return go


def test_a_case_not_proven_fails_the_run(qualify):
    result, run = qualify()
    result.assert_outcomes(failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines([f"*{CASE.split('/')[1]}* not proven: {UNMADE}*"])
    data = json.loads((run / "results.json").read_text())
    assert data["allow_unproven"] is False and data["cases"][0]["unproven"] == [UNMADE]
    failure = ET.parse(run / "junit.xml").getroot().find(".//failure")
    assert failure.get("message").startswith(f"Failed: NOT PROVEN: {UNMADE}")


def test_a_run_that_allows_it_reports_it_skipped_with_why_never_passed(qualify):
    result, run = qualify("--handoff-allow-unproven")
    result.assert_outcomes(skipped=1)
    assert result.ret == 0
    data = json.loads((run / "results.json").read_text())
    assert data["allow_unproven"] is True
    skipped = ET.parse(run / "junit.xml").getroot().find(".//skipped")
    assert skipped.get("message").startswith(f"not proven: {UNMADE}")
    assert junit_counts(run / "junit.xml") == (0, 0, 1)
