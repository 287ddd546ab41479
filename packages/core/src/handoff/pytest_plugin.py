"""pytest integration: options, markers, and the cases of a backend as parametrized items."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from handoff import lifecycle, releases
from handoff.backend import TIMEOUT_MARKER, Backend
from handoff.cases import SELECTIONS, Case, backend_cases, only, topology
from handoff.errors import HandoffError
from handoff.machine import firewall, interrupts, ownership
from handoff.machine.environment import find_nats_server, handoff_command
from handoff.machine.interrupts import INTERRUPTS
from handoff.plugins import configured_backend
from handoff.pool import PoolKey, Pools
from handoff.runner import Settings
from handoff.runs import durations
from handoff.runs.progress import LiveProgress
from handoff.runs.report import case_table
from handoff.runs.results import FILE as RESULTS_FILE
from handoff.runs.results import PROPERTY, CaseRecord, RunResults, describe, tally
from handoff.settings import CHOICES
from handoff.sharing import scheduling
from handoff.verdict import FAILED, KNOWN_DEFECT, NOT_PROVEN

#: The workerinput key by which the controller tells an xdist worker it groups items by pool.
LOADGROUP = "handoff_loadgroup"
#: The workerinput key of the run folder, and where each process keeps its own.
RUN_DIR_KEY = "handoff_run_dir"
RUN_DIR = pytest.StashKey[Path]()
MARKERS = {
    "pre_merge": "case of a pre_merge selection",
    "nightly": "case of a nightly selection",
    f"{TIMEOUT_MARKER}(seconds)": "the most one handoff case may take, start-up to teardown",
}


def add_release_options(group) -> None:
    """The Dynamo release a run qualifies, and the other one a mixed deployment runs."""
    group.addoption(
        "--handoff-dynamo",
        metavar="VERSION",
        help="the Dynamo release this run qualifies: the run fails at once where this "
        "environment holds another (default: the dynamo setting, else the one installed)",
    )
    group.addoption(
        "--handoff-beside",
        metavar="VERSION",
        help="another Dynamo release, whose processes a mixed deployment runs (--handoff-mix)",
    )
    group.addoption(
        "--handoff-mix",
        help="which processes run from the --handoff-beside release: frontend, alternate, "
        "replacements or prefill (docs/upgrades.md)",
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("handoff", "handoff migration qualification")
    group.addoption("--handoff-backend", help="backend whose cases to run, e.g. mocker")
    group.addoption(
        "--handoff-selection", default="pre_merge", choices=SELECTIONS, help="case selection"
    )
    group.addoption(
        "--handoff-topology",
        action="append",
        help="topology whose cases to run (repeatable); default: every one the backend runs",
    )
    group.addoption(
        "--handoff-case",
        action="append",
        help="run only this case: <topology>/<case id>, or a case id in any topology "
        "(repeatable; `handoff cases` lists them)",
    )
    add_release_options(group)
    group.addoption(
        "--handoff-logs",
        default=".handoff/runs",
        help="folder for run logs; a failed case's logs are kept there",
    )
    group.addoption(
        "--handoff-keep-logs",
        action="store_true",
        help="keep logs of passed cases and of their pools too",
    )
    group.addoption(
        "--handoff-allow-unproven",
        action="store_true",
        help="a case not proven (a check it exists for could not be made) is reported as "
        "skipped, with the checks and why, instead of failing the run; still never a pass",
    )
    group.addoption(
        "--handoff-graceful-bound",
        type=float,
        help="seconds between SIGTERM and SIGKILL in graceful_shutdown cases "
        "(default: graceful_bound_s of [tool.handoff], else 2)",
    )
    group.addoption(
        "--handoff-device",
        help="device the backend's workers run on, for a backend that offers more than one "
        "(vllm: cuda or cpu; default: the device setting of [tool.handoff], else the first)",
    )
    add_deployment_options(group)
    scheduling.add_options(group)


def add_deployment_options(group) -> None:
    """How a case's processes are deployed: fresh or from a pool, its spares, its discovery."""
    group.addoption(
        "--handoff-fresh",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start every case's workers anew, as Dynamo's own suite does (default: "
        "fresh_deployments of [tool.handoff], else warm worker pools)",
    )
    group.addoption(
        "--handoff-discovery",
        choices=CHOICES["discovery"],
        help="where Dynamo's processes find each other: its file store, or etcd started by "
        "handoff on loopback (default: discovery of [tool.handoff], else file)",
    )
    group.addoption(
        "--handoff-spare-workers",
        type=int,
        help="workers of the faulted role each pool keeps ready (default: spare_workers of "
        "[tool.handoff], else 1)",
    )


@pytest.hookimpl(tryfirst=True)  # before junitxml reads its path
def pytest_configure(config: pytest.Config) -> None:
    interrupts.remember()
    if not hasattr(config, "workerinput"):  # the controller, not an xdist worker
        _reap("before this run")
        check_release(config)
    for marker, text in MARKERS.items():
        config.addinivalue_line("markers", f"{marker}: {text}")
    # CPU slots and the VRAM ledger; before xdist (trylast) starts its workers.
    scheduler = scheduling.Scheduler(
        config, cpus_per_case(config), recorded_seconds(config), selected_count(config)
    )
    config.pluginmanager.register(scheduler, "handoff-scheduler")
    if getattr(config.option, "dist", "no") == "load":
        if pooled(config):
            # Each xdist worker keeps its own pools: hand it every case of a pool, in turn.
            config.option.dist = "loadgroup"
        elif qualifying(config):
            # A worker done with its share takes cases queued behind a long one elsewhere.
            config.option.dist = "worksteal"
    if getattr(config, "workerinput", {}).get(LOADGROUP):
        config.option.loadgroup = True  # xdist's worker names each item's group from this
    name = config.getoption("handoff_backend")
    if name:
        config.addinivalue_line("markers", f"{name}: case run against the {name} backend")
        _split_by_recorded_durations(config)
    config.stash[RUN_DIR] = own_run_dir(config)
    # The qualification suite always leaves JUnit XML for CI beside its results.json.
    dry_run = config.getoption("handoff_dry_run")
    if qualifying(config) and not config.option.xmlpath and not dry_run:
        config.option.xmlpath = str(config.stash[RUN_DIR] / "junit.xml")


def own_run_dir(config: pytest.Config) -> Path:
    """One run folder for the whole run: an xdist worker gets its controller's; any other
    process makes its own, never one it inherited. A pytest run started by a case or a test
    (its environment copied) has pools of the same names (gw0-1-...): in the outer run's
    folder it would stop and remove the outer run's pools from under their cases."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return Path(workerinput[RUN_DIR_KEY])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (Path(config.getoption("handoff_logs")) / f"{stamp}-{os.getpid()}").resolve()


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` in a qualification run: as many cases as fit the CPU slots by what one case
    of the backend keeps busy (xdist's own counts physical cores, and one case a core)."""
    if not qualifying(config) or not config.getoption("handoff_backend"):
        return None
    config.stash[scheduling.AUTO] = True
    return scheduling.fitting_workers(cpus_per_case(config), selected_count(config))[0]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """An xdist worker decides whether to group items from its own command line, which never
    says loadgroup when the controller chose it above: tell it, and its run folder."""
    node.workerinput[LOADGROUP] = node.config.option.dist == "loadgroup"
    node.workerinput[scheduling.DIST_KEY] = node.config.option.dist
    node.workerinput[RUN_DIR_KEY] = str(node.config.stash[RUN_DIR])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give pytest-split (trylast) each case's recorded duration under the node id it has in
    this process, matched by its case key: xdist's loadgroup has renamed it `<node id>@<pool>`
    (xdist registered after this plugin, so it ran first), and pytest takes its rootdir, so
    the id's path, from any argument naming an existing folder (`--handoff-logs DIR`)."""
    split = config.pluginmanager.get_plugin("pytestsplitplugin")
    if split is None:
        return
    recorded = split.cached_durations
    by_key = {case_key(nodeid): seconds for nodeid, seconds in recorded.items()}
    for item in items:
        key = case_key(item.nodeid)
        if item.nodeid not in recorded and key in by_key:
            recorded[item.nodeid] = by_key[key]


def case_key(nodeid: str) -> str:
    """`aggregate/<case id>` of a qualification node id, whatever its path and group."""
    return plain_nodeid(nodeid).rpartition("[")[2].removesuffix("]")


def plain_nodeid(nodeid: str) -> str:
    """The node id without the `@<group>` that xdist's loadgroup appends."""
    head, at, group = nodeid.rpartition("@")
    return head if at and "]" not in group else nodeid


def cpus_per_case(config: pytest.Config) -> float:
    """What one case of the chosen backend keeps busy; 1 until the backend is known to load
    (a bad --handoff-backend is reported at collection, in one line)."""
    try:
        return chosen_backend(config).cpus_per_case
    except HandoffError:
        return 1.0


def selected_count(config: pytest.Config) -> int | None:
    """How many cases the command line selects here; None for a bad selection (reported at
    collection, in one line) or outside a qualification run."""
    if not qualifying(config) or not config.getoption("handoff_backend"):
        return None
    try:
        return len(selected_cases(config, chosen_backend(config)))
    except HandoffError:
        return None


def recorded_seconds(config: pytest.Config) -> dict[str, float]:
    """What each case of the chosen backend took when recorded (none for a bad backend)."""
    try:
        return durations.recorded_seconds(chosen_backend(config))
    except HandoffError:
        return {}


def check_release(config: pytest.Config) -> None:
    """The installed Dynamo release against handoff's entry for it, once a run, before any
    worker starts (`releases.checked`): a release handoff does not know, or not the one asked
    for, ends the run in one line. A backend that cannot be had is said at collection."""
    if not qualifying(config) or not config.getoption("handoff_backend"):
        return
    try:
        backend = chosen_backend(config)
    except HandoffError:
        return
    if backend.release_modules:
        try:
            releases.checked(backend.setting("dynamo"), backend.release_modules)
        except HandoffError as exc:
            raise pytest.UsageError(str(exc)) from None


def qualifying(config: pytest.Config) -> bool:
    """Whether the run is of handoff's cases (`--pyargs handoff.qualification`)."""
    return "handoff.qualification" in config.args


def pooled(config: pytest.Config) -> bool:
    """Whether the run's cases draw warm workers from pools (not known for a bad backend)."""
    try:
        return not chosen_backend(config).setting("fresh_deployments")
    except HandoffError:
        return False


def _split_by_recorded_durations(config: pytest.Config) -> None:
    """For `--splits N --group G`: pytest-split reads the backend's durations file (the
    `durations_file` setting) and balances by least duration, unless the command line names
    its own file or algorithm."""
    given = [str(arg) for arg in config.invocation_params.args]
    if not any(a.startswith("--durations-path") for a in given):
        try:
            config.option.durations_path = str(durations.path_for(chosen_backend(config)))
        except HandoffError:
            return  # a bad --handoff-backend is reported at collection, in one line
    if not any(a.startswith("--splitting-algorithm") for a in given):
        config.option.splitting_algorithm = "least_duration"


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # xdist workers interrupted mid-case leave orphans
        _reap("after this run")


def _reap(when: str) -> None:
    for line in ownership.reap_orphans():
        print(f"handoff: killed {line}, left running by a run that no longer exists ({when})")
    for line in firewall.reap_orphans():
        print(f"handoff: deleted {line}, left in place by a run that no longer exists ({when})")
    for line in ownership.reap_folders():
        print(f"handoff: removed {line}, left by a run that no longer exists ({when})")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """An interrupt swallowed where it arrived stops the run before the next test starts."""
    if INTERRUPTS:
        raise KeyboardInterrupt(f"signal {INTERRUPTS[0]}, swallowed where it arrived")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if INTERRUPTS and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.INTERRUPTED


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "handoff_case" not in metafunc.fixturenames:
        return
    try:
        params = case_params(metafunc.config)
    except HandoffError as exc:
        message = str(exc)
    else:
        metafunc.parametrize("handoff_case", params)
        return
    pytest.fail(message, pytrace=False)  # a collection error of one line, no traceback


def chosen_backend(config: pytest.Config) -> Backend:
    """The --handoff-backend, configured from [tool.handoff] under the command line."""
    name = config.getoption("handoff_backend")
    if not name:
        raise HandoffError(
            "the handoff suite needs --handoff-backend, e.g. --handoff-backend mocker"
        )
    overrides = {
        "graceful_bound_s": (
            config.getoption("handoff_graceful_bound"),
            "--handoff-graceful-bound",
        ),
        "device": (config.getoption("handoff_device"), "--handoff-device"),
        "fresh_deployments": (config.getoption("handoff_fresh"), "--handoff-fresh"),
        "spare_workers": (config.getoption("handoff_spare_workers"), "--handoff-spare-workers"),
        "discovery": (config.getoption("handoff_discovery"), "--handoff-discovery"),
        "dynamo": (config.getoption("handoff_dynamo"), "--handoff-dynamo"),
        "beside": (config.getoption("handoff_beside"), "--handoff-beside"),
        "mix": (config.getoption("handoff_mix"), "--handoff-mix"),
    }
    # Looked up from where pytest started, not from its rootdir: pytest takes the rootdir from
    # any argument naming an existing folder, option values included (`--handoff-logs DIR`).
    return configured_backend(name, overrides, Path(config.invocation_params.dir))


def case_params(config: pytest.Config) -> list:
    """The chosen selection as pytest params, marked with selection, backend and the backend's
    markers (timeout, VRAM, KV cap). Fails at once when the engine, or the nats-server the
    nats plane's cases need, is not here."""
    backend = chosen_backend(config)
    backend.check_environment()
    chosen = config.getoption("handoff_selection")
    cases = selected_cases(config, backend)
    if any(case.plane == "nats" for case in cases):
        find_nats_server()
    params = []
    for case in cases:
        marks = [getattr(pytest.mark, chosen), getattr(pytest.mark, backend.name)]
        if not backend.setting("fresh_deployments"):
            key = PoolKey.of(backend, case, backend.roles(case.topology))
            marks.append(pytest.mark.xdist_group(key.label))
        for marker, value in backend.markers(case).items():
            if marker not in MARKERS and marker != TIMEOUT_MARKER:
                config.addinivalue_line("markers", f"{marker}(value): set by {backend.name}")
            marks.append(getattr(pytest.mark, marker)(value))
        params.append(pytest.param(case, id=case.key, marks=marks))
    return params


def selected_cases(config: pytest.Config, backend: Backend) -> list[Case]:
    """The cases the command line selects that this machine can run, before pytest-split
    takes a share of them."""
    chosen = str(backend.setting("discovery"))
    return [c for c in chosen_cases(config, backend) if not missing_here(c, chosen)]


def missing_here(case: Case, chosen: str) -> tuple[str, str] | None:
    """What `case` cannot run without on this machine, and why (`lifecycle.missing`)."""
    return lifecycle.missing(case.fault, chosen, topology(case.topology).on_etcd)


def chosen_cases(config: pytest.Config, backend: Backend) -> list[Case]:
    chosen = config.getoption("handoff_selection")
    cases = backend_cases(backend, config.getoption("handoff_topology"), chosen)
    return only(cases, config.getoption("handoff_case"), backend.name, chosen)


def not_run_here(config: pytest.Config) -> list[str]:
    """One line for each thing this machine lacks (nftables, etcd): how many of the chosen
    cases need it, and the fix."""
    if not config.getoption("handoff_backend"):
        return []
    try:
        backend = chosen_backend(config)
        cases = chosen_cases(config, backend)
    except HandoffError:
        return []  # reported at collection, in one line
    missing: dict[str, list[Case]] = {}
    for case in cases:
        if found := missing_here(case, str(backend.setting("discovery"))):
            what, why = found
            missing.setdefault(f"{what} cases not run: {why}", []).append(case)
    return [f"handoff: {len(held)} {line}" for line, held in missing.items()]


@pytest.fixture(scope="session")
def handoff_backend(request: pytest.FixtureRequest) -> Backend:
    return chosen_backend(request.config)


@pytest.fixture(scope="session")
def handoff_settings(request: pytest.FixtureRequest, handoff_backend: Backend) -> Settings:
    return Settings(
        graceful_bound_s=float(handoff_backend.setting("graceful_bound_s")),
        stream_timeout_s=int(handoff_backend.setting("stream_timeout_s")),
        startup_timeout_s=float(handoff_backend.setting("startup_timeout_s")),
        keep_logs=request.config.getoption("handoff_keep_logs"),
    )


@pytest.fixture(scope="session")
def handoff_run_dir(request: pytest.FixtureRequest) -> Path:
    return request.config.stash[RUN_DIR]


def planned_cases(backend: Backend, items: list[pytest.Item]) -> Counter[PoolKey]:
    """How many cases of each pool key this process will run. Every xdist worker collects
    every item, and loadgroup sends all of a key's cases to one of them: the one that
    starts that key's pool."""
    cases = [item.callspec.params["handoff_case"] for item in items if is_case(item)]
    return Counter(PoolKey.of(backend, case, backend.roles(case.topology)) for case in cases)


def is_case(item: pytest.Item) -> bool:
    return "handoff_case" in getattr(getattr(item, "callspec", None), "params", {})


@pytest.fixture(scope="module")
def handoff_pools(request: pytest.FixtureRequest, handoff_backend: Backend, handoff_run_dir: Path):
    """This pytest process's warm worker pools, or None for fresh deployments; every pool is
    stopped after the suite's module (the whole run for `--pyargs handoff.qualification`), on
    Ctrl-C and SIGTERM too."""
    if handoff_backend.setting("fresh_deployments"):
        yield None
        return
    worker = getattr(request.config, "workerinput", {}).get("workerid", "main")
    keep_logs = request.config.getoption("handoff_keep_logs")
    mine = [item for item in request.session.items if item.module is request.module]
    planned = planned_cases(handoff_backend, mine)
    pools = Pools(handoff_run_dir / "pools", f"{worker}-", keep_logs, planned)
    try:
        yield pools
    finally:
        if problems := pools.close():
            raise HandoffError("the pools did not stop cleanly: " + "; ".join(problems))


class RunReport:
    """Gathers every case's record (from xdist workers too); shows live progress on a
    terminal, and at the end the case table and results.json in the run folder."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: list[CaseRecord] = []
        #: One line per collection error; a run that ends there still leaves a readable run.
        self.collection_errors: list[str] = []
        self.writes_junit = bool(config.option.xmlpath)
        self.started = time.monotonic()
        self.progress = LiveProgress() if sys.stderr.isatty() else None

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.progress:
            self.progress.start(len(session.items))

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.progress:
            self.progress.started(nodeid)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        outcome = None
        if report.when == "call" and PROPERTY in props:
            record = CaseRecord.from_json(props[PROPERTY])
            record.nodeid = plain_nodeid(report.nodeid)
            self.records.append(record)
            outcome = record.outcome
        if self.progress and (report.when == "call" or report.outcome == "failed"):
            failed = outcome == FAILED or (outcome is None and report.outcome != "passed")
            self.progress.finished(report.nodeid, not failed, outcome == NOT_PROVEN)

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            lines = str(report.longrepr).strip().splitlines() or ["(no message)"]
            self.collection_errors.append(f"{report.nodeid or 'collection'}: {lines[-1]}")

    @pytest.hookimpl
    def pytest_sessionfinish(self) -> None:
        if self.progress:
            self.progress.stop()
        if self.collection_errors and not self.records and self.writes_junit:
            # The run folder holds junit.xml already: make it a run `handoff report` reads.
            error = "the run ended at collection, before any case: " + self.collection_errors[0]
            self.results([], error).write()
        elif self.records:
            self.results(self.records).write()

    def results(self, records: list[CaseRecord], error: str = "") -> RunResults:
        name = self.config.getoption("handoff_backend") or ""
        backend = chosen_backend(self.config) if records else None
        option = self.config.option
        splits = getattr(option, "splits", None)
        return RunResults(
            backend=name,
            selection=self.config.getoption("handoff_selection"),
            run_dir=str(self.config.stash[RUN_DIR]),
            wall_s=round(time.monotonic() - self.started, 3),
            cases=records,
            handoff_version=importlib.metadata.version("handoff"),
            dynamo=releases.installed() or "",
            beside=(backend.setting("beside") or "") if backend else "",
            mix=(backend.setting("mix") or "") if backend else "",
            device=backend.device if backend else "",
            selection_keys=[c.key for c in selected_cases(self.config, backend)] if backend else [],
            split={"splits": splits, "group": option.group} if splits else None,
            error=error,
            allow_unproven=self.config.getoption("handoff_allow_unproven"),
        )

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        for line in not_run_here(self.config):
            tr.write_line(line)
        if not self.records:
            return
        tr.section("handoff cases")
        width = max(tr._tw.fullwidth, 160)  # case keys are long; CI logs do not wrap
        console = Console(file=io.StringIO(), width=width, force_terminal=tr.hasmarkup)
        console.print(case_table(self.records, title=""))
        for line in console.file.getvalue().splitlines():
            tr.write_line(line)
        for case in self.records:
            if case.outcome == NOT_PROVEN:
                tr.write_line(f"{case.key} not proven: {'; '.join(case.unproven)}")
                tr.write_line(f"logs kept for {case.key}: {case.folder}")
            elif case.outcome == KNOWN_DEFECT:
                tr.write_line(f"{case.key} failed as expected: {case.upstream_defect}")
            elif not case.passed:
                tr.write_line(f"{case.key} failed in {case.phase}; the last events before it:")
                for event in case.last_events:
                    tr.write_line("    " + describe(event))
                tr.write_line(f"logs kept for {case.key}: {case.folder}")
        tr.write_line(tally(self.records))
        run_dir = self.config.stash[RUN_DIR]
        command = handoff_command()
        tr.write_line(f"results: {run_dir}/{RESULTS_FILE}; report: {command} report {run_dir}")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller sees every case
        session.config.pluginmanager.register(RunReport(session.config), "handoff-run-report")
