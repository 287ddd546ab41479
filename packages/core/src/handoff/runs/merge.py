"""`handoff merge`: the shards of one split run (`--splits N --group G` on N runners) put back
together as one run folder, so that the verdict, JUnit and report read as if one machine ran it.
Shards that do not add up to one run are refused, each mismatch in one line."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from handoff.errors import HandoffError
from handoff.runs.report import case_folder
from handoff.runs.results import FILE, RunResults

JUNIT = "junit.xml"
#: JUnit counters a merged suite adds up over its shards.
COUNTS = ("tests", "failures", "errors", "skipped")


def merge(run_dirs: list[Path], out: Path) -> RunResults:
    """Check the shards, then write `out`: results.json, junit.xml and every case's folder."""
    shards = [RunResults.load(d) for d in run_dirs]
    check(list(zip(run_dirs, shards, strict=True)))
    suites = [suite for run_dir in run_dirs for suite in _suites(run_dir / JUNIT)]
    if out.exists() and any(out.iterdir()):
        raise HandoffError(f"{out} already holds files: give -o a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    first = shards[0]
    order = {key: n for n, key in enumerate(first.selection_keys)}
    cases = []
    for run_dir, shard in zip(run_dirs, shards, strict=True):
        for case in shard.cases:
            source = case_folder(run_dir, case)
            if source.is_dir():
                shutil.copytree(source, out / case.key)
                case.folder = str((out / case.key).resolve())
            cases.append(case)
    merged = RunResults(
        backend=first.backend,
        selection=first.selection,
        run_dir=str(out.resolve()),
        wall_s=max(s.wall_s for s in shards),  # the shards ran side by side
        cases=sorted(cases, key=lambda c: order[c.key]),
        handoff_version=first.handoff_version,
        device=first.device,
        selection_keys=first.selection_keys,
        # A case not proven fails the merged run unless every shard allowed it.
        allow_unproven=all(s.allow_unproven for s in shards),
    )
    merged.write()
    write_junit(suites, out / JUNIT)
    return merged


def check(shards: list[tuple[Path, RunResults]]) -> None:
    """One line for the first way the shards are not one run's."""
    first_dir, first = shards[0]
    for run_dir, shard in shards:
        if shard.split is None:
            raise HandoffError(
                f"{run_dir} is not a shard (it ran without --splits): give the runs of "
                "--splits N --group G, G = 1..N"
            )
    same: list[tuple[str, Callable[[RunResults], object]]] = [
        ("backends", lambda s: (s.backend, s.device)),
        ("selections", lambda s: (s.selection, s.selection_keys)),
        ("handoff versions", lambda s: s.handoff_version),
        ("numbers of shards (--splits)", lambda s: s.split["splits"]),
    ]
    for what, value in same:
        for run_dir, shard in shards:
            if value(shard) != value(first):
                raise HandoffError(
                    f"the shards ran different {what}: {run_dir} and {first_dir} differ; "
                    "merge the shards of one run"
                )
    groups: dict[int, Path] = {}
    for run_dir, shard in shards:
        group = shard.split["group"]
        if group in groups:
            raise HandoffError(f"shard {group} is given twice: {groups[group]} and {run_dir}")
        groups[group] = run_dir
    splits = first.split["splits"]
    if missing := sorted(set(range(1, splits + 1)) - set(groups)):
        raise HandoffError(
            f"shard {missing[0]} of {splits} is missing: give the run folder of --group "
            f"{missing[0]} too"
        )
    seen: dict[str, Path] = {}
    for run_dir, shard in shards:
        for case in shard.cases:
            if case.key in seen:
                raise HandoffError(
                    f"case {case.key} appears twice: in {seen[case.key]} and {run_dir}"
                )
            seen[case.key] = run_dir
    if never := [key for key in first.selection_keys if key not in seen]:
        more = f" and {len(never) - 1} more" if len(never) > 1 else ""
        raise HandoffError(
            f"case {never[0]}{more} of the selection ran in no shard: rerun its shard "
            "(a case that errored before its verdict has no record)"
        )


def write_junit(suites: list[ET.Element], out: Path) -> None:
    """One <testsuite> holding every shard's test cases, its counters and time added up."""
    merged = ET.Element("testsuite", dict(suites[0].attrib) if suites else {})
    for counter in COUNTS:
        merged.set(counter, str(sum(int(s.get(counter, 0)) for s in suites)))
    merged.set("time", f"{sum(float(s.get('time', 0)) for s in suites):.3f}")
    for suite in suites:
        merged.extend(suite.findall("testcase"))
    document = ET.Element("testsuites")
    document.append(merged)
    ET.ElementTree(document).write(out, encoding="utf-8", xml_declaration=True)


def _suites(path: Path) -> list[ET.Element]:
    try:
        return list(ET.parse(path).getroot().iter("testsuite"))
    except (OSError, ET.ParseError) as exc:
        raise HandoffError(
            f"cannot read {path} ({exc}): give shard folders as their runs left them "
            f"(junit.xml beside {FILE})"
        ) from None
