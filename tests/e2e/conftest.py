"""Every end-to-end test, pass or fail, must leave no process that handoff started.

A case a test expects to pass passes by its reasons (every check made held): under nox -s
tests' twelve workers on two cores a migration's boundary may be left not proven, the
continuity's verdict, which the main job enforces (mocker_pre_merge) and test_not_proven_runs
tests."""

import os
import uuid

import psutil
import pytest
from leaks import marked, name_of, reap, running

from handoff.machine.ownership import MARK_ENV


@pytest.fixture(autouse=True)
def handoff_mark(monkeypatch) -> str:
    """This test's mark: every process handoff starts for it carries it, and the runs it starts
    (their environment copied from this one) pass it on to theirs."""
    mark = f"test-{uuid.uuid4().hex}"
    monkeypatch.setenv(MARK_ENV, mark)
    return mark


@pytest.fixture(autouse=True)
def nested_runs_without_hypothesis(monkeypatch):
    """The pytest runs a test starts load no Hypothesis: only the unit tests use it, and its
    plugin's import is a sixth of such a run's start (benchmarks/RESULTS.md as of 708d296)."""
    addopts = os.environ.get("PYTEST_ADDOPTS", "")
    monkeypatch.setenv("PYTEST_ADDOPTS", f"{addopts} -p no:hypothesispytest".strip())


@pytest.fixture(autouse=True)
def nothing_left_running(request, handoff_mark):
    """Only the warm pool a qualification run keeps for its next case may outlive a test (the
    pool's own teardown fails the run if it leaves anything), and the docker engine that the
    container tests share (stopped, with its children, after them). A process is the test's
    if it is under the test's own tree or carries its mark: a child whose parent died before
    it, re-parented to init (vLLM's EngineCore), or one detached into a session of its own.
    What a test leaves fails that test and is killed, so that the tests after it on the same
    xdist worker are not blamed for it (a hung Ctrl-C once failed four more)."""
    yield
    pools = request.node.funcargs.get("handoff_pools")
    kept = {p.pid for p in pools.live_processes()} if pools else set()
    if engine := request.node.funcargs.get("docker_engine"):
        dockerd = psutil.Process(engine.process.pid)
        kept |= {p.pid for p in [dockerd, *dockerd.children(recursive=True)]}
    tree = running(psutil.Process().children(recursive=True))
    ours = {p.pid: p for p in [*tree, *marked(handoff_mark)]}
    left = [p for pid, p in sorted(ours.items()) if pid not in kept]
    named = [(p.pid, name_of(p)) for p in left]
    reap(left)  # this test fails for them; the next one on this worker starts clean
    assert left == [], f"processes left behind: {named}"


#: The longest tests' modules, longest first (benchmarks/suite_cpu.py): the container tests'
#: image build, the joins' frozen joiner, the report's real run, the shards' three runs.
FIRST = ("test_container_runs.py", "test_join.py", "test_report_browser.py", "test_shards.py")


@pytest.hookimpl(trylast=True)  # on what -k, -m and the rest left selected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Where test_shards.py is selected too, test_qualification.py leaves it the topologies
    it runs (three shard runs, merged and checked as one run), so that each pre-merge case runs
    once in the suite. The slowest groups collected first, then the other end-to-end tests, and
    the unit tests last, so that xdist hands out the long ones first and the short ones fill
    the end: the whole suite otherwise waits on a long test that started last."""
    shards = next((i.module for i in items if i.path.name == "test_shards.py"), None)
    if shards is not None:
        sharded = {
            i
            for i in items
            if i.path.name == "test_qualification.py"
            and i.callspec.id.split("/")[0] in shards.TOPOLOGIES
        }
        config.hook.pytest_deselected(items=list(sharded))
        items[:] = [i for i in items if i not in sharded]
    items.sort(key=lambda item: (
        next((n for n, f in enumerate(FIRST) if item.path.name == f), len(FIRST)),
        item.path.parent.name == "unit",
    ))  # fmt: skip
