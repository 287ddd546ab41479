"""Six of the mocker's decode pre-merge cases split by pytest-split into 3 shards, run
as 3 separate processes on Dynamo's frontend and mocker workers, then put back together by
`handoff merge`: every case exactly once, all passed but the known upstream defects, one JUnit
file and one report. Every way shards can fail
to add up to one run is refused in one line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from handoff.cases import backend_cases
from handoff_mocker import MockerBackend

#: The merge tests share one set of shards: keep them on one xdist worker.
pytestmark = pytest.mark.xdist_group("shards")
SPLITS = 3
#: Six of the decode topology's cases, two expected failures among them: enough for three
#: shards of two, at a third of the whole topology's cost.
TOPOLOGIES = ("decode",)
FAULTS = ("worker_failure", "graceful_shutdown", "drain_expired")
KEYS = [c.key for c in backend_cases(MockerBackend(), TOPOLOGIES, "pre_merge") if c.fault in FAULTS]
CHOSEN = [arg for key in KEYS for arg in ("--handoff-case", key)]
REPO = Path(__file__).resolve().parents[2]


def handoff(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "handoff.cli", *map(str, args)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    """The run folders of groups 1, 2 and 3, run side by side as CI runners would."""
    base = tmp_path_factory.mktemp("shards")
    runs = []
    for group in range(1, SPLITS + 1):
        command = [
            sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification",
            "-p", "no:cacheprovider", "--handoff-backend", "mocker",
            "--handoff-logs", str(base / f"group-{group}"),
            "--splits", str(SPLITS), "--group", str(group), *CHOSEN,
        ]  # fmt: skip
        output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
        runs.append(subprocess.Popen(command, cwd=REPO, **output))
    for group, run in enumerate(runs, start=1):
        out, _ = run.communicate(timeout=600)
        assert run.returncode == 0, f"group {group}:\n{out[-3000:]}"
        assert f"Running group {group}/{SPLITS}" in out
    return [next((base / f"group-{g}").iterdir()) for g in range(1, SPLITS + 1)]


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_three_shards_merge_into_the_whole_selection_each_case_once(shards, tmp_path):
    whole = KEYS
    assert len(whole) == 6
    shares = [[c["key"] for c in results(d)["cases"]] for d in shards]
    assert all(0 < len(share) < len(whole) for share in shares), shares
    assert [results(d)["split"] for d in shards] == [
        {"splits": SPLITS, "group": g} for g in range(1, SPLITS + 1)
    ]

    merged = handoff("merge", *shards, "-o", tmp_path / "merged")
    assert merged.returncode == 0, merged.stderr + merged.stdout[-2000:]
    assert "6 cases: 4 passed, 0 failed, 2 failed as known upstream defects" in merged.stdout
    run = results(tmp_path / "merged")
    keys = [c["key"] for c in run["cases"]]
    assert sorted(keys) == sorted(whole) and len(set(keys)) == len(keys)
    assert all(c["passed"] or c["upstream_defect"] for c in run["cases"])
    assert run["split"] is None and run["selection_keys"] == whole

    suite = ET.parse(tmp_path / "merged" / "junit.xml").getroot().find("testsuite")
    names = [case.get("name") for case in suite.iter("testcase")]
    assert sorted(names) == sorted(f"test_migration[{key}]" for key in whole)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("6", "0", "0")

    # The merged folder is a run like any other: its report exits 0 and draws every timeline
    # from the case folders copied out of the shards.
    report = handoff("report", tmp_path / "merged")
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "merged" / "report.html").read_text()
    assert page.count('<svg class="timeline"') == 6
    assert "no history.json" not in page
    for case in run["cases"]:
        assert Path(case["folder"]).parent.parent == (tmp_path / "merged").resolve()


def altered(shard: Path, to: Path, change) -> Path:
    """A copy of a shard's folder whose results.json `change` has edited."""
    shutil.copytree(shard, to)
    data = results(to)
    change(data)
    (to / "results.json").write_text(json.dumps(data))
    return to


def drop_a_case(data: dict) -> None:
    data["cases"].pop()


MISMATCHES = {
    "a shard missing": (lambda s, t: [s[0], s[1]], "shard 3 of 3 is missing"),
    "a shard twice": (lambda s, t: [s[0], s[0], s[1], s[2]], "shard 1 is given twice"),
    "a case twice": (
        lambda s, t: [s[0], s[1], altered(s[0], t, lambda d: d["split"].update(group=3))],
        "appears twice",
    ),
    "another backend": (
        lambda s, t: [s[0], s[1], altered(s[2], t, lambda d: d.update(backend="other"))],
        "different backends",
    ),
    "another selection": (
        lambda s, t: [s[0], s[1], altered(s[2], t, lambda d: d["selection_keys"].pop())],
        "different selections",
    ),
    "another handoff version": (
        lambda s, t: [s[0], s[1], altered(s[2], t, lambda d: d.update(handoff_version="0.0.1"))],
        "different handoff versions",
    ),
    "a case in no shard": (
        lambda s, t: [s[0], s[1], altered(s[2], t, drop_a_case)],
        "of the selection ran in no shard",
    ),
    "a run that is not a shard": (
        lambda s, t: [s[0], s[1], altered(s[2], t, lambda d: d.update(split=None))],
        "is not a shard",
    ),
}


@pytest.mark.parametrize("mismatch", MISMATCHES)
def test_shards_that_are_not_one_run_are_refused_in_one_line(shards, tmp_path, mismatch):
    given, expected = MISMATCHES[mismatch]
    refused = handoff("merge", *given(shards, tmp_path / "altered"), "-o", tmp_path / "merged")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("handoff: error: ")
    assert expected in refused.stderr, refused.stderr
    assert not (tmp_path / "merged").exists()  # nothing half-written


def split(*args: str | Path) -> list[tuple[list[str], float]]:
    """The node ids `handoff qualify` collects for each group of 3, and each group's estimate."""
    groups = []
    for group in range(1, SPLITS + 1):
        listed = handoff(
            "qualify", "--backend", "mocker", "--splits", SPLITS, "--group", group,
            "--collect-only", "-q", *args,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr
        assert f"Running group {group}/{SPLITS}" in listed.stdout
        ids = [line for line in listed.stdout.splitlines() if "::test_migration[" in line]
        estimate = re.search(r"estimated duration: ([\d.]+)s", listed.stdout).group(1)
        groups.append((ids, float(estimate)))
    whole = [c.key for c in backend_cases(MockerBackend(), None, "pre_merge")]
    ids = [i for share, _ in groups for i in share]
    assert sorted(key_of(i) for i in ids) == sorted(whole)  # each case once
    return groups


def key_of(nodeid: str) -> str:
    return nodeid.rpartition("[")[2].removesuffix("]")


@pytest.mark.parametrize("moved", [False, True], ids=["rootdir", "rootdir-moved"])
def test_qualify_splits_by_the_repositorys_recorded_durations(tmp_path, moved):
    """Also when an argument naming an existing folder moves pytest's rootdir, and with it
    the path in every node id: durations are matched by case key."""
    recorded = json.loads((REPO / "durations" / "mocker.json").read_text())
    by_key = {key_of(nodeid): seconds for nodeid, seconds in recorded.items()}
    for ids, estimate in split(*(["--handoff-logs", tmp_path] if moved else [])):
        if moved:
            assert not any(i in recorded for i in ids)  # another path in every id
        assert estimate == pytest.approx(sum(by_key[key_of(i)] for i in ids), abs=0.01)


def test_a_durations_path_on_the_command_line_wins(tmp_path):
    for ids, estimate in split("--durations-path", tmp_path / "none.json"):
        assert estimate == len(ids)  # no durations: pytest-split weighs every case as 1
