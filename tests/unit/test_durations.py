"""`handoff durations`: pytest-split's durations file from handoff's own run records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handoff.cli import main
from handoff.runs.results import CaseRecord, RunResults

PREFIX = "packages/core/src/handoff/qualification.py::test_migration"
SELECTION = [
    "aggregate/a", "aggregate/b", "aggregate/c", "decode/d", "decode/e", "kv_transfer/f",
]  # fmt: skip


def run(folder: Path, seconds: dict[str, float], backend: str = "mocker", **extra) -> Path:
    """A run folder whose results.json records these cases' seconds."""
    cases = [
        CaseRecord(key=k, passed=True, phase="verdict", seconds=s, nodeid=f"{PREFIX}[{k}]")
        for k, s in seconds.items()
    ]
    RunResults(
        backend=backend, selection="pre_merge", run_dir=str(folder), wall_s=1.0, cases=cases,
        handoff_version="0.1.0", selection_keys=SELECTION, **extra,
    ).write()  # fmt: skip
    return folder


def test_each_case_gets_its_median_and_the_rest_their_topologys_then_the_selections(
    tmp_path, capsys
):
    one = run(tmp_path / "one", {"aggregate/a": 1.0, "aggregate/b": 5.0, "decode/d": 20.0})
    two = run(tmp_path / "two", {"aggregate/a": 3.0, "aggregate/b": 7.0, "decode/d": 30.0})
    three = run(tmp_path / "three", {"aggregate/a": 2.0})
    out = tmp_path / "durations.json"
    assert main(["durations", str(one), str(two), str(three), "-o", str(out)]) == 0
    durations = json.loads(out.read_text())
    assert durations == {
        f"{PREFIX}[aggregate/a]": 2.0,  # median of 1, 3, 2
        f"{PREFIX}[aggregate/b]": 6.0,  # median of 5, 7
        f"{PREFIX}[aggregate/c]": 4.0,  # not run: its topology's median, of 2 and 6
        f"{PREFIX}[decode/d]": 25.0,
        f"{PREFIX}[decode/e]": 25.0,
        f"{PREFIX}[kv_transfer/f]": 6.0,  # no case of its topology ran: of 2, 6 and 25
    }
    assert "6 cases, 3 measured, 3 estimated" in capsys.readouterr().out


def test_the_default_file_is_the_backends_durations_file_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.handoff.mocker]\ndurations_file = "ci/mocker-times.json"\n'
    )
    assert main(["durations", str(run(tmp_path / "r", {"aggregate/a": 1.0}))]) == 0
    assert (tmp_path / "ci" / "mocker-times.json").is_file()
    (tmp_path / "pyproject.toml").unlink()
    assert main(["durations", str(tmp_path / "r")]) == 0
    assert (tmp_path / "durations" / "mocker.json").is_file()


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        ({"backend": "other"}, "different backends or devices (mocker, other)"),
        ({"device": "cpu"}, "different backends or devices (mocker, mocker on cpu)"),
    ],
)
def test_runs_of_different_backends_are_refused_in_one_line(tmp_path, capsys, second, expected):
    one = run(tmp_path / "one", {"aggregate/a": 1.0})
    two = run(tmp_path / "two", {"aggregate/a": 1.0}, **second)
    assert main(["durations", str(one), str(two), "-o", str(tmp_path / "d.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err
    assert not (tmp_path / "d.json").exists()


def test_runs_that_recorded_no_node_id_are_refused_in_one_line(tmp_path, capsys):
    old = run(tmp_path / "old", {"aggregate/a": 1.0})
    data = json.loads((old / "results.json").read_text())
    for case in data["cases"]:
        del case["nodeid"]  # as results.json was before node ids were recorded
    (old / "results.json").write_text(json.dumps(data))
    assert main(["durations", str(old), "-o", str(tmp_path / "d.json")]) == 2
    assert "recorded its pytest node id" in capsys.readouterr().err
