"""docs/upgrades.md says what the code does: its tables of mixes and of kinds of difference are
the code's, and the releases it names are ones handoff knows."""

import re
from pathlib import Path

from handoff import releases
from handoff.releases import mixes
from handoff.runs import compare

PAGE = (Path(__file__).parents[2] / "docs" / "upgrades.md").read_text()


def rows(heading: str) -> list[str]:
    """The first cells of the table after `heading` (its header row left out)."""
    section = PAGE[PAGE.index(heading) :]
    table = re.search(r"((?:^\|.*\|\n)+)", section, re.M).group(1).splitlines()
    return [line.split("|")[1].strip() for line in table[2:]]


def test_the_mixes_are_the_codes():
    assert rows("| mix |") == list(mixes.MIXES)


def test_the_kinds_of_difference_are_the_codes():
    kinds = [compare.REGRESSION, compare.FIX_ARRIVED, compare.NEW_DEFECT, compare.LOST_PROOF]
    kinds += [compare.FLIPPED]
    kinds += [compare.MEANING, f"{compare.ONLY_A}, {compare.ONLY_B}"]
    assert rows("| kind |") == kinds


def test_every_release_the_page_names_is_known():
    named = set(re.findall(r"\b1\.\d\.\d\b", PAGE))
    assert named <= set(releases.known()), named - set(releases.known())
    assert "1.7.1" in named and not releases.facts("1.7.1").installable


def test_each_difference_it_lists_between_1_5_1_and_1_6_is_an_entry():
    changed = {change.field for _, change in releases.changes_between("1.5.1", "1.6.0")}
    assert {
        "mocker_engine_args", "loopback_env", "event_plane_on_loopback", "refusal_code",
        "unmigrated_end", "mocker_cpu_scale",
    } <= changed  # fmt: skip
    assert len(rows("| what | 1.5.1 |")) == 6


def test_the_cases_at_once_it_gives_are_the_mockers(monkeypatch):
    from handoff_mocker import MockerBackend

    assert "4 cases at once on 2 CPUs" in PAGE and "16 cases at once on 2 CPUs" in PAGE
    for release, at_once in (("1.5.1", 4), ("1.6.1", 16)):
        monkeypatch.setattr(releases, "current", lambda r=release: releases.facts(r))
        assert 2 / MockerBackend().cpus_per_case == at_once


def test_the_mixes_it_says_fail_as_expected_are_those_the_defect_names():
    from handoff import policies

    table = PAGE[PAGE.index("| releases | frontend |") :].split("\n\n", 1)[0].splitlines()
    heads = [h.strip().split(" ")[0] for h in table[0].split("|")[2:-1]]
    for line in table[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        old, new = re.findall(r"\d\.\d\.\d", cells[0])
        assert new == releases.current().version  # judged here as the newer one's run
        for how, said in zip(heads, cells[1:], strict=True):
            defect = policies.mixed_defect(mixes.Mix(how, old, "/v/python"))
            assert (defect is not None) == said.startswith("strict expected failure"), (line, how)
