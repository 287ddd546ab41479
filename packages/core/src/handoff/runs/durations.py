"""pytest-split's durations file, written from handoff's own records, so that `--splits N
--group G` balances shards by what each case really took on the team's machines."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from handoff.backend import Backend
from handoff.errors import HandoffError
from handoff.runs.results import RunResults

#: Where a backend's durations live by default, relative to the working folder (the
#: repository root, where nox and CI run): committed, so that every runner reads the same file.
FOLDER = Path("durations")


def path_for(backend: Backend) -> Path:
    """The `durations_file` setting, else durations/<backend>.json (<backend>-<device>.json for
    a backend that offers more than one device: a CPU case takes far longer than a GPU one)."""
    configured = backend.setting("durations_file")
    if configured:
        return Path(str(configured)).expanduser()
    label = f"{backend.name}-{backend.device}" if backend.devices else backend.name
    return FOLDER / f"{label}.json"


def recorded_seconds(backend: Backend) -> dict[str, float]:
    """Case key (`<topology>/<case id>`) -> the seconds its durations file records; empty
    where the backend has no such file or it cannot be read."""
    try:
        recorded = json.loads(path_for(backend).read_text())
    except (OSError, ValueError):
        return {}
    return {nodeid.rpartition("[")[2].rstrip("]"): float(s) for nodeid, s in recorded.items()}


def median_durations(runs: list[RunResults]) -> tuple[dict[str, float], int]:
    """Node id -> seconds for every case of the runs' selections: the median over the runs of
    a case that ran; else the median of its topology's cases, else of all of them. Returns the
    durations and how many cases were measured."""
    _same_backend(runs)
    seconds: dict[str, list[float]] = defaultdict(list)
    prefixes: Counter[str] = Counter()
    for run in runs:
        for case in run.cases:
            seconds[case.key].append(case.seconds)
            if case.nodeid:
                prefixes[case.nodeid.removesuffix(f"[{case.key}]")] += 1
    # pytest names the module from a rootdir that an argument can move (see pytest_plugin's
    # case_key): prefer a path that names the module file, then the most common.
    prefix = max(prefixes, key=lambda p: (".py::" in p, prefixes[p]), default="")
    if not prefix:
        raise HandoffError(
            "no case of these runs recorded its pytest node id (results.json of handoff 0.1 "
            "before `handoff durations` existed): give runs made since"
        )
    measured = {key: statistics.median(values) for key, values in seconds.items()}
    by_topology: dict[str, list[float]] = defaultdict(list)
    for key, value in measured.items():
        by_topology[topology_of(key)].append(value)
    overall = statistics.median(measured.values())
    keys = {key for run in runs for key in run.selection_keys} | set(measured)
    result = {}
    for key in sorted(keys):
        same_topology = by_topology.get(topology_of(key))
        estimate = statistics.median(same_topology) if same_topology else overall
        result[f"{prefix}[{key}]"] = round(measured.get(key, estimate), 3)
    return result, len(measured)


def topology_of(key: str) -> str:
    return key.split("/", 1)[0]


def _same_backend(runs: list[RunResults]) -> None:
    kinds = {(run.backend, run.device) for run in runs}
    if len(kinds) > 1:
        names = ", ".join(f"{b} on {d}" if d else b for b, d in sorted(kinds))
        raise HandoffError(
            f"these runs used different backends or devices ({names}): give the runs of one, "
            "since each has its own durations file"
        )


def write(path: Path, durations: dict[str, float]) -> None:
    """The file as pytest-split writes its own: a JSON object, sorted, indented."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(durations, indent=4, sort_keys=True) + "\n")
    except OSError as exc:
        raise HandoffError(f"cannot write {path} ({exc}): give a writable -o FILE") from None
