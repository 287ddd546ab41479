"""The plugin turns a backend's selection into pytest items usable with -m, -k and -n."""

import subprocess
import sys
from pathlib import Path

import pytest

from handoff.cases import TOPOLOGIES, Case, selection
from handoff.pool import PoolKey
from handoff.pytest_plugin import RUN_DIR
from handoff.runs.results import FILE as RESULTS_FILE
from handoff.runs.results import RunResults
from handoff_mocker import MockerBackend

#: The topologies the mocker runs (not decode_race: its race never shows there).
MOCKER_TOPOLOGIES = [t for t in TOPOLOGIES if MockerBackend().why_not(t) is None]


def qualification(*args, backend="mocker"):
    """The qualification suite in a fresh pytest; backend=None leaves the option out."""
    chosen = ("--handoff-backend", backend) if backend else ("-o", "addopts=")
    command = [sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification"]
    return subprocess.run(
        [*command, "-p", "no:cacheprovider", *chosen, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def case_of(key: str) -> Case:
    topology, case_id = key.split("/")
    return Case.from_id(case_id, topology)


def collected(*args):
    result = qualification("--collect-only", "-q", *args)
    return [line for line in result.stdout.splitlines() if "::test_migration[" in line]


def test_items_carry_the_case_keys_and_a_pools_cases_run_together():
    ids = [item.split("[", 1)[1].rstrip("]") for item in collected()]
    keys = [c.key for t in MOCKER_TOPOLOGIES for c in selection(t, "pre_merge")]
    assert sorted(ids) == sorted(keys)
    backend = MockerBackend()
    pools = [PoolKey.of(backend, case_of(i), backend.roles(case_of(i).topology)) for i in ids]
    runs = [key for n, key in enumerate(pools) if n == 0 or pools[n - 1] != key]
    assert len(runs) == len(set(pools)), f"a pool's cases are split: {runs}"


@pytest.mark.parametrize(
    ("args", "count"),
    [
        (("-m", "pre_merge and mocker"), 68),
        (("-m", "nightly"), 0),
        # The deadline's own marker; `timeout` is pytest-timeout's, which would enforce it.
        (("-m", "handoff_timeout"), 68),
        (("-m", "timeout"), 0),
        (("-k", "aggregate and nats"), 22),
        (("-k", "aggregate and migration_disabled and unary"), 6),
        (("--handoff-topology", "decode"), 14),
        (("--handoff-topology", "kv_transfer", "--handoff-topology", "prefill"), 6),
        (("--handoff-selection", "nightly"), None),  # the generated count, made in the test
        # aggregate, decode, kv_transfer, prefill, guided, choices, usage, abandoned, load,
        # decode_load, join, rolling, discovery.
        (
            ("--handoff-selection", "full"),
            200 + 96 + 16 + 64 + 64 + 64 + 16 + 12 + 96 + 96 + 36 + 56,
        ),
        (("--handoff-selection", "full", "--handoff-topology", "aggregate"), 200),
    ],
)
def test_markers_and_keywords_select_cases(args, count):
    if count is None:  # generating the nightly costs seconds: not at import, in every worker
        count = sum(len(selection(t, "nightly")) for t in MOCKER_TOPOLOGIES)
    assert len(collected(*args)) == count


def test_missing_backend_option_is_one_clear_line():
    result = qualification("--collect-only", "-q", backend=None)
    assert result.returncode == 2
    assert "the handoff suite needs --handoff-backend, e.g. --handoff-backend mocker" in (
        result.stdout
    )
    assert "Traceback" not in result.stdout and "pluggy" not in result.stdout


def test_cases_run_on_two_xdist_workers_in_a_run_folder_of_their_own(request):
    """Started from this session's environment, as a test or a CI step starts one: its
    workers share one run folder, and it is not this session's, whose pools have the same
    names (before, it inherited this session's folder and removed a running pool's files)."""
    # Two cases of two pool keys (NATS and TCP): one on each xdist worker.
    # The run folders are what this is for: a case a loaded machine leaves not proven is
    # allowed here (the continuity's verdict, not the collection's), a failure is not.
    result = qualification(
        "-n", "2", "-k", "aggregate and worker_failure and stream", "--handoff-allow-unproven"
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "2 cases: " in result.stdout and " 0 failed" in result.stdout
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("results: ")]
    run_dir = Path(line.removeprefix("results: ").split(f"/{RESULTS_FILE};")[0])
    cases = RunResults.load(run_dir).cases
    assert len(cases) == 2 and len({c.pool.split("-")[0] for c in cases}) == 2, cases
    assert run_dir != request.config.stash[RUN_DIR]


@pytest.mark.parametrize(
    ("args", "decode"),
    [((), 0), (("-k", "decode and test_migration"), 14)],
    ids=["shards-selected", "shards-deselected"],
)
def test_the_suite_runs_each_decode_case_in_the_shards_or_else_here(args, decode):
    """test_qualification.py leaves the decode cases to test_shards.py only where the shards
    run too (tests/e2e/conftest.py): deselected by -k, they run here."""
    e2e = Path(__file__).parent
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         str(e2e / "test_qualification.py"), str(e2e / "test_shards.py"), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    cases = [line for line in listed.stdout.splitlines() if "::test_migration[decode/" in line]
    assert len(cases) == decode, listed.stdout[-2000:]
