"""README.md is what a newcomer trusts first: it stays short, its sample is a real run's own
output that agrees with the case model (each row's verdict and the tally), and every figure
in its prose is one the code gives. Counts are written as digits, so that each is checked."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from handoff.cases import TOPOLOGIES, backend_cases, topology
from handoff.commands.catalog import expected
from handoff_mocker import MockerBackend

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
SAMPLE = README.split("<!-- sample:")[1].split("<!-- /sample -->")[0]
MOCKER = backend_cases(MockerBackend(), None, "pre_merge")
ROW = re.compile(r"^ {4}│ (\S+) +│ (PASS|FAIL|XFAIL upstream|NOT PROVEN) +│.*│ ([^│]*?) *│$", re.M)


def pinned_release() -> str:
    line = next(x for x in (REPO / "requirements/dynamo.txt").read_text().splitlines()
                if x.startswith("ai-dynamo=="))  # fmt: skip
    return line.split("==")[1]


def facts() -> dict[str, str]:
    """Every figure the README may state, each with what in the code gives it."""
    python = tomllib.loads((REPO / "packages/core/pyproject.toml").read_text())
    defects = sum(expected(c)[0] is not None for c in MOCKER)
    return {
        pinned_release(): "the pinned Dynamo release",
        python["project"]["requires-python"].removeprefix(">="): "the oldest Python",
        str(len(MOCKER)): "the mocker's pre-merge cases",
        str(len(MOCKER) - defects): "the mocker's pre-merge cases expected to pass",
        str(defects): "the mocker's pre-merge cases expected to fail as known defects",
        str(sum(MockerBackend().why_not(t) is None for t in TOPOLOGIES)): "the mocker's topologies",
        str(len(TOPOLOGIES)): "the topologies",
        str(len(vllm_cpu_cases())): "vLLM's CPU pre-merge cases",
    }


def vllm_cpu_cases():
    from handoff import plugins

    backend = plugins.configured_backend("vllm", {"device": ("cpu", "--device")})
    try:
        return backend_cases(backend, None, "pre_merge")
    finally:
        plugins.configured_backend("vllm")  # the shared backend back on its default device


def prose() -> str:
    """The README without its code blocks, its sample and its code spans."""
    text = re.sub(r"(?m)^ {4}.*$", "", README.replace(SAMPLE, ""))
    return re.sub(r"`[^`]*`", "", text)


def test_the_pages_a_newcomer_reads_first_are_short():
    assert README.count("\n") <= 120
    assert (REPO / "docs" / "architecture.md").read_text().count("\n") <= 300


def test_every_figure_in_the_prose_is_the_codes():
    known = facts()
    stated = re.findall(r"(?<![\w.-])\d+(?:\.\d+)*(?![\w.-]*\w)", prose())
    assert stated, "the README states no figure: this test would check nothing"
    assert [s for s in stated if s not in known] == [], f"figures the code gives: {known}"


def test_the_sample_tallies_the_main_job_as_the_case_model_expects():
    (tally,) = re.findall(r"(\d+) cases: (\d+) passed, (\d+) failed, (\d+) failed as known", SAMPLE)
    defects = sum(expected(c)[0] is not None for c in MOCKER)
    assert tuple(map(int, tally)) == (len(MOCKER), len(MOCKER) - defects, 0, defects)
    assert f"Dynamo {pinned_release()}, {len(MOCKER)} cases" in SAMPLE


def test_each_sample_row_is_a_case_with_the_verdict_its_defect_gives():
    rows = ROW.findall(SAMPLE)
    assert len(rows) >= 5, SAMPLE
    by_key = {c.key: c for c in MOCKER}
    for key, verdict, reason in rows:
        defect, _ = expected(by_key[key])
        assert verdict == ("XFAIL upstream" if defect else "PASS"), key
        assert reason == (defect.issue.partition(": ")[0] if defect else ""), key
    assert {topology(k.split("/")[0]).name for k, _, _ in rows} >= {"aggregate", "load"}
