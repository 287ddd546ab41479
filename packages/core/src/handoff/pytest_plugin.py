"""pytest integration: options, markers, and the cases of a backend as parametrized items."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from handoff.cases import SELECTIONS, backend_cases
from handoff.errors import HandoffError
from handoff.plugins import get_backend
from handoff.runner import Settings

RUN_DIR_ENV = "HANDOFF_RUN_DIR"
MARKERS = {
    "pre_merge": "case of a pre_merge selection",
    "nightly": "case of a nightly selection",
    "timeout(seconds)": "the most one handoff case may take, start-up to teardown",
}


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
        "--handoff-logs",
        default=".handoff/runs",
        help="folder for run logs; a failed case's logs are kept there",
    )
    group.addoption(
        "--handoff-keep-logs", action="store_true", help="keep logs of passed cases too"
    )
    group.addoption(
        "--handoff-graceful-bound",
        type=float,
        default=Settings.graceful_bound_s,
        help="seconds between SIGTERM and SIGKILL in graceful_shutdown cases",
    )


def pytest_configure(config: pytest.Config) -> None:
    for marker, text in MARKERS.items():
        config.addinivalue_line("markers", f"{marker}: {text}")
    name = config.getoption("handoff_backend")
    if name:
        config.addinivalue_line("markers", f"{name}: case run against the {name} backend")
    # One run folder for the whole run, xdist workers included: they inherit the environment.
    if RUN_DIR_ENV not in os.environ:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path(config.getoption("handoff_logs")) / f"{stamp}-{os.getpid()}"
        os.environ[RUN_DIR_ENV] = str(run_dir.resolve())


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


def case_params(config: pytest.Config) -> list:
    """The chosen selection as pytest params, marked with selection, backend and timeout."""
    name = config.getoption("handoff_backend")
    if not name:
        raise HandoffError(
            "the handoff suite needs --handoff-backend, e.g. --handoff-backend mocker"
        )
    backend = get_backend(name)
    chosen = config.getoption("handoff_selection")
    marks = [
        getattr(pytest.mark, chosen),
        getattr(pytest.mark, backend.name),
        pytest.mark.timeout(backend.case_timeout_s),
    ]
    return [
        pytest.param(case, id=case.key, marks=marks)
        for case in backend_cases(backend, config.getoption("handoff_topology"), chosen)
    ]


@pytest.fixture(scope="session")
def handoff_backend(request: pytest.FixtureRequest):
    return get_backend(request.config.getoption("handoff_backend"))


@pytest.fixture(scope="session")
def handoff_settings(request: pytest.FixtureRequest) -> Settings:
    config = request.config
    return Settings(
        graceful_bound_s=config.getoption("handoff_graceful_bound"),
        keep_logs=config.getoption("handoff_keep_logs"),
    )


@pytest.fixture(scope="session")
def handoff_run_dir() -> Path:
    return Path(os.environ[RUN_DIR_ENV])


class CaseLines:
    """Collects one line per case (from xdist workers too) and prints them at the end."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float, dict[str, str]]] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if "verdict" in props and report.when == "call":
            case_id = report.nodeid.rsplit("[", 1)[-1].rstrip("]")
            self.rows.append((case_id, report.outcome, report.duration, props))

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.rows:
            return
        tr = terminalreporter
        tr.section("handoff cases")
        for case_id, outcome, seconds, props in sorted(self.rows):
            verdict = "PASS" if outcome == "passed" else "FAIL"
            tr.write_line(f"{verdict}  {case_id:<72} {seconds:6.1f} s")
            if "logs" in props:
                tr.write_line(f"      logs kept: {props['logs']}")
        failed = sum(1 for r in self.rows if r[1] != "passed")
        tr.write_line(f"{len(self.rows)} cases: {len(self.rows) - failed} passed, {failed} failed")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.pluginmanager.register(CaseLines(), "handoff-case-lines")
