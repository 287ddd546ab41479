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


def claims() -> dict[str, str]:
    """Each figure the README may state, by the words around it, with the value the code gives."""
    python = tomllib.loads((REPO / "packages/core/pyproject.toml").read_text())
    mocker_topologies = sum(MockerBackend().why_not(t) is None for t in TOPOLOGIES)
    return {
        r"Python (\S+) ": python["project"]["requires-python"].removeprefix(">="),
        r"Dynamo (\S+)'s frontend": pinned_release(),
        r"It runs (\d+) cases of the": str(len(MOCKER)),
        r"of the (\d+) topologies the mocker": str(mocker_topologies),
        r"serves \(of (\d+)\)": str(len(TOPOLOGIES)),
        r"runs (\d+) cases on Dynamo's own": str(len(vllm_cpu_cases())),
    }


def vllm_cpu_cases():
    from handoff import plugins

    backend = plugins.configured_backend("vllm", {"device": ("cpu", "--device")})
    try:
        return backend_cases(backend, None, "pre_merge")
    finally:
        plugins.configured_backend("vllm")  # the shared backend back on its default device


def prose() -> str:
    """The README's words: without its sample, its code spans and its indented code blocks
    (those after a blank line), but with the comments of their lines."""
    lines, kept, in_block = README.replace(SAMPLE, "").splitlines(), [], False
    for before, line in zip(["", *lines], lines, strict=False):
        in_block = line.startswith("    ") and (in_block or not before.strip())
        kept.append(line.partition(" # ")[2] if in_block else line)
    return re.sub(r"`[^`\n]*`", "", "\n".join(kept))


def test_the_pages_a_newcomer_reads_first_are_short():
    assert len(README.splitlines()) <= 120
    assert len((REPO / "docs" / "architecture.md").read_text().splitlines()) <= 300


def test_every_figure_in_the_prose_is_the_codes():
    """Each figure is claimed by the words around it and is the code's value; a figure no claim
    covers (a count added, or moved to other words) fails too, and so does a claim no longer
    made."""
    text, covered = prose(), set()
    for words, value in claims().items():
        found = list(re.finditer(words, text))
        assert found, f"the README no longer says {words!r}: drop the claim"
        for claim in found:
            assert claim[1] == value, f"README says {claim[0]!r}; the code gives {value}"
            covered.add(claim.start(1))
    stated = re.finditer(r"(?<![\w.-])\d+(?:\.\d+)*(?![\w.-]*\w)", text)
    unclaimed = [m[0] for m in stated if m.start() not in covered]
    assert unclaimed == [], f"figures no test checks: {unclaimed}"
    words = re.findall(rf"\b(?:{'|'.join(NUMBER_WORDS)})\b", text, re.I)
    assert words == [], f"counts in words, which no test checks: write them as digits: {words}"


#: Counts written as words; "two commands" and "one case" name the README's own sections.
NUMBER_WORDS = (
    "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "twenty", "thirty", "forty", "fifty", "sixty",
    "seventy", "eighty", "ninety", "hundred", "dozen",
)  # fmt: skip


def test_the_case_the_readme_pastes_is_one_it_lists():
    (key,) = re.findall(r"--handoff-case (\S+?)`", README)
    assert key in {c.key for c in MOCKER}


def test_the_sample_tallies_the_main_job_as_the_case_model_expects():
    (tally,) = re.findall(r"(\d+) cases: (\d+) passed, (\d+) failed, (\d+) failed as known", SAMPLE)
    defects = sum(expected(c)[0] is not None for c in MOCKER)
    assert tuple(map(int, tally)) == (len(MOCKER), len(MOCKER) - defects, 0, defects)
    assert f"Dynamo {pinned_release()}, {len(MOCKER)} cases" in SAMPLE


def test_each_sample_row_is_a_case_with_the_verdict_its_defect_gives():
    rows = ROW.findall(SAMPLE)
    assert len(rows) >= 5, SAMPLE
    assert len(rows) == SAMPLE.count("\n    │ "), "a row of the sample that is no case's row"
    by_key = {c.key: c for c in MOCKER}
    for key, verdict, reason in rows:
        defect, _ = expected(by_key[key])
        assert verdict == ("XFAIL upstream" if defect else "PASS"), key
        assert reason == (defect.issue.partition(": ")[0] if defect else ""), key
    assert {topology(k.split("/")[0]).name for k, _, _ in rows} >= {"aggregate", "load"}
