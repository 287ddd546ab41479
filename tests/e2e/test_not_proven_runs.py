"""A qualification run whose case is really not proven (tests/unproven_run.py: the new
worker's first frames reach the client back to back and no record settles where they begin),
run as users run it: it fails the run, shown as NOT PROVEN with why, unless the run allows it
(`--handoff-allow-unproven`), which reports it as skipped, never as passed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CASE = "aggregate/migration_enabled-worker_failure-chat-stream-nats"
WHY = "is followed by frames read back to back: the client had fallen behind"


def qualify(logs: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict, Path]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
        "PYTEST_ADDOPTS": "",  # nox -s tests allows not proven there; this run decides itself
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification",
         "-p", "no:cacheprovider", "-p", "unproven_run", "--handoff-backend", "mocker",
         "--handoff-case", CASE, "--handoff-logs", str(logs), *args],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
    )  # fmt: skip
    run = next(logs.iterdir())
    return result, json.loads((run / "results.json").read_text()), run


@pytest.mark.parametrize("allowed", [False, True], ids=["refused", "allowed"])
def test_a_case_not_proven_fails_the_run_unless_allowed(tmp_path, allowed):
    args = ["--handoff-allow-unproven"] if allowed else []
    result, results, run = qualify(tmp_path / "runs", *args)
    out = result.stdout + result.stderr
    assert result.returncode == (0 if allowed else 1), out[-3000:]
    (case,) = results["cases"]
    assert case["key"] == CASE and not case["passed"] and case["reasons"] == []
    (unmade,) = case["unproven"]
    assert WHY in unmade
    assert results["allow_unproven"] is allowed
    assert "1 cases: 0 passed, 0 failed, 1 not proven" in out
    assert f"{CASE} not proven: " in out
    testcase = ET.parse(run / "junit.xml").getroot().find(".//testcase")
    outcome = testcase.find("skipped" if allowed else "failure")
    assert outcome is not None and WHY in outcome.get("message"), ET.tostring(testcase)
    assert ("skipped" if allowed else "failed") in out.splitlines()[-1]
    # Its logs are kept, as a failure's, while its pool was not discarded.
    folder = Path(case["folder"])
    assert (folder / "frontend.log").is_file()
    assert any(folder.glob("pool-*/worker-*.log"))
    report = subprocess.run(
        [sys.executable, "-m", "handoff.cli", "report", str(run)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert report.returncode == (0 if allowed else 1), report.stdout[-2000:]
    assert f"NOT PROVEN {CASE}" in report.stdout
