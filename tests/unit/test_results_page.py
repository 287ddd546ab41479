"""benchmarks/RESULTS.md is a record, not a diary (issue 65): at most 600 lines, and under each
question one table of its measurements, after the command that made them, every row dated. So
the latest figure of a question is found at once, and a benchmark a question names either
exists or the question says it was retired."""

import re
from datetime import date
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
PAGE = BENCHMARKS / "RESULTS.md"
DATE = re.compile(r"20\d\d-\d\d-\d\d")
IN_BACKTICKS = re.compile(r"`([^`]+)`")
SCRIPT = re.compile(r"benchmarks/(\w+)\.py")
#: What a command that measured something starts with.
RUNNERS = (
    "nox ",
    "python",
    ".nox/",
    "bash ",
    "PATH=",
    "PYTHONPATH=",
    "taskset ",
    "pytest",
    "handoff ",
    "DYN_",
)


def questions() -> dict[str, list[str]]:
    """Each `## ` section's lines by its heading: the intro above the first and the log left out."""
    found: dict[str, list[str]] = {}
    lines = None
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            lines = found.setdefault(line.removeprefix("## "), [])
        elif lines is not None:
            lines.append(line)
    found.pop("Log")
    return found


def test_the_page_is_at_most_600_lines():
    assert len(PAGE.read_text().splitlines()) <= 600


@pytest.mark.parametrize("heading", questions())
def test_a_question_has_one_table_after_its_command_and_every_row_dated(heading):
    lines = questions()[heading]
    starts = [
        i for i, line in enumerate(lines[:-1])
        if line.startswith("|") and lines[i + 1].startswith("|---")
    ]  # fmt: skip
    assert len(starts) == 1, f"{len(starts)} tables"
    (start,) = starts
    commands = IN_BACKTICKS.findall("\n".join(lines[:start]))
    assert any(c.startswith(RUNNERS) for c in commands), f"no command before the table: {commands}"
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    assert rows, "a table without a row"
    width = lines[start].count("|")
    assert [row for row in rows if row.count("|") != width] == [], "a row of other cells"
    dates = [dated(row) for row in rows]
    assert dates == sorted(dates, reverse=True), "the latest row is not first"


def dated(row: str) -> date:
    """The row's date, its first cell (a real day, not only its shape)."""
    first = row.strip("|").split("|")[0].strip()
    assert DATE.fullmatch(first), f"a row whose first cell is no date: {row}"
    return date.fromisoformat(first)


@pytest.mark.parametrize("heading", questions())
def test_a_benchmark_a_kept_question_runs_exists(heading):
    text = "\n".join([heading, *questions()[heading]])
    named = {name for command in IN_BACKTICKS.findall(text) for name in SCRIPT.findall(command)}
    gone = {name for name in named if not (BENCHMARKS / f"{name}.py").exists()}
    assert not gone or "retired" in text, gone
