"""Warm worker pools on the real Dynamo frontend and mocker workers: a case draws exactly its
instances, a spare nobody sees takes the faulted worker's place, a dead worker's entries are
removed (and a case would fail on them), and a failed case takes its pool down with its logs.
A case here passes by its reasons: the suite's load may leave a migration's boundary not
proven, which is the continuity's verdict (mocker_pre_merge's), not the pool's."""

import linecache
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import requests
from leaks import ports_held
from misbehaving import DETACH, DetachedChild, kill_strays, strays_under

from handoff import faults
from handoff import pool as pool_module
from handoff.cases import Case
from handoff.client import InFlight, Request
from handoff.deployment import Deployment
from handoff.machine import registrations, wallclock
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.policies import POLICIES, policy
from handoff.pool import PoolKey, Pools
from handoff.runner import Settings, run_case
from handoff.runs import report
from handoff.runs.results import CaseRecord, RunResults
from handoff.settings import Configuration, Setting
from handoff_mocker import MockerBackend

SETTINGS = Settings(keep_logs=True)
#: Two cases of one pool: mocker aggregate workers on the TCP plane.
FIRST = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")
SECOND = Case.from_id("migration_disabled-worker_failure-chat-unary-tcp")
#: A case of that key whose request outlasts a few draws: 900 tokens.
LONG = Case.from_id("migration_enabled-graceful_shutdown-chat-stream-tcp")


@pytest.fixture
def pools(tmp_path):
    pools = Pools(tmp_path / "pools")
    yield pools
    assert pools.close() == []


def ready(result) -> dict:
    return next(e.data for e in result.history.events if e.name == "ready")


def removed(result) -> list[str]:
    return next(e.data for e in result.history.events if e.name == "teardown_done")["removed"]


@pytest.fixture
def health_seen(monkeypatch) -> dict[Path, tuple[set[int], list[tuple[float, set[int]]]]]:
    """Each case's frontend's /health, read over and over from the moment the case is ready
    until its teardown begins: case folder -> (the drawn workers' instance ids, and per read
    the monotonic time and the ids listed). A read that fails ends that case's reads early,
    which the test's check of their span then sees."""
    seen: dict[Path, tuple[set[int], list[tuple[float, set[int]]]]] = {}
    watching: dict[Path, tuple[threading.Event, threading.Thread]] = {}
    start, stop = Deployment.start, Deployment.stop

    def watched_start(self, deadline):
        start(self, deadline)
        reads: list[tuple[float, set[int]]] = []
        seen[self.folder] = (set().union(*self.expected_instances().values()), reads)
        done = threading.Event()

        def read():
            health = requests.get(self.base_url + "/health", timeout=2).json()
            reads.append((time.monotonic(), {i["instance_id"] for i in health["instances"]}))
            return (True if done.is_set() else None), reads[-1]

        thread = threading.Thread(target=poll_until, args=(read, Deadline(60), "the teardown"))
        thread.start()
        watching[self.folder] = (done, thread)
        # The case begins once the watch has read: its first read comes before the request.
        poll_until(lambda: (bool(reads) or None, len(reads)), Deadline(10), "the first read")

    def watched_stop(self):
        if self.folder in watching:
            done, thread = watching.pop(self.folder)
            done.set()
            thread.join()
        return stop(self)

    monkeypatch.setattr(Deployment, "start", watched_start)
    monkeypatch.setattr(Deployment, "stop", watched_stop)
    return seen


def test_the_next_case_draws_the_survivor_and_the_spare_and_nothing_is_left(
    pools, tmp_path, health_seen
):
    backend = MockerBackend()
    first = run_case(backend, FIRST, tmp_path / "first", SETTINGS, 60, pools=pools)
    assert not first.verdict.reasons, first.verdict.summary()
    pool = pools.current[1]
    before = ready(first)
    spare = next(w for w in pool.workers if w.name not in before["workers"])
    assert spare.name in pool.own_store  # a spare, in a discovery folder of its own,
    request_at = first.history.started + next(
        e.at for e in first.history.events if e.name == "request_sent"
    )
    assert spare.process.started_at < request_at  # running all through the first case,
    faulted = next(e.data["worker"] for e in first.history.events if e.name == "fault_sent")
    at = {e.name: e.at for e in first.history.events}  # the successor started at the fault
    assert at["worker_gone"] <= at["successor_started"] < at["teardown_done"]
    # and neither it nor the successor, both registered, was ever listed by the case's
    # frontend, read from ready to teardown.
    (successor,) = [w for w in pool.spares if w is not spare]

    def registered():
        ids = [registrations.instance_ids(pool.own_store[w.name], w.ports["system"])
               for w in (spare, successor)]  # fmt: skip
        return (set().union(*ids) if all(ids) else None), ids

    unseen = poll_until(registered, Deadline(10), "the spare and the successor to register")
    drawn, reads = health_seen[tmp_path / "first"]
    assert not drawn & unseen, (drawn, unseen)
    assert set().union(*(ids for _, ids in reads)) == drawn, reads
    # From before the request to after the counters' last reading, which ends the case.
    last = first.history.started + at["metrics_reread"]
    assert reads[0][0] <= request_at and reads[-1][0] >= last, (reads[0][0], reads[-1][0])
    assert any(entry.startswith("v1/instances/") for entry in removed(first))

    second = run_case(backend, SECOND, tmp_path / "second", SETTINGS, 60, pools=pools)
    assert not second.verdict.reasons, second.verdict.summary()
    after = ready(second)
    assert after["pool"] == before["pool"] and after["cases_before"] == 1
    survivor = next(w for w in before["workers"] if w != faulted)
    assert sorted(after["workers"]) == sorted([survivor, spare.name])
    pids = [p.pid for p in pool.processes]
    leased = pool.leases.ports

    assert pools.close() == []
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
    assert ports_held(leased) == {}
    assert not pool.folder.exists()  # no case failed on it: its logs went with it


def test_a_pool_starts_no_worker_for_a_case_that_will_not_come(tmp_path):
    """Planned for two cases, a pool starts its two workers and one spare, and no successor
    for the second case's fault; a third case, unplanned, gets a new pool."""
    backend = MockerBackend()
    key = PoolKey.of(backend, FIRST, backend.roles(FIRST.topology))
    pools = Pools(tmp_path / "pools", planned=Counter({key: 2}))
    cases = [run_case(backend, c, tmp_path / str(i), SETTINGS, 60, pools=pools)
             for i, c in enumerate([FIRST, SECOND])]  # fmt: skip
    assert all(not r.verdict.reasons for r in cases), [r.verdict.reasons for r in cases]
    pool = pools.current[1]
    assert pool.spent
    assert [p.name for p in pool.processes if p.name.startswith("worker-")] == [
        "worker-0-aggregate", "worker-1-aggregate", "worker-2-aggregate",
    ]  # fmt: skip
    assert not [e for r in cases for e in r.history.events if e.name == "successor_started"]

    third = run_case(backend, FIRST, tmp_path / "third", SETTINGS, 60, pools=pools)
    assert not third.verdict.reasons, third.verdict.summary()
    assert ready(third)["pool"] != ready(cases[1])["pool"] and ready(third)["cases_before"] == 0
    assert pools.close() == []


def test_a_pool_without_spares_starts_the_successor_after_the_case(pools, tmp_path):
    """Nothing but the case's own processes runs beside a case in a pool that keeps no spare."""
    backend = MockerBackend()
    backend.configure(Configuration("mocker", {"spare_workers": Setting(0, "test")}))
    first = run_case(backend, FIRST, tmp_path / "first", SETTINGS, 60, pools=pools)
    assert not first.verdict.reasons, first.verdict.summary()
    assert not [e for e in first.history.events if e.name == "successor_started"]
    pool = pools.current[1]
    (successor,) = [w for w in pool.workers if w.name not in ready(first)["workers"]]
    counted = first.history.started + next(
        e.at for e in first.history.events if e.name == "metrics_read"
    )
    assert successor.process.started_at > counted  # after the case's response and counters
    second = run_case(backend, SECOND, tmp_path / "second", SETTINGS, 60, pools=pools)
    assert not second.verdict.reasons, second.verdict.summary()
    assert successor.name in ready(second)["workers"]


def test_a_draw_refuses_a_busy_worker_and_a_silent_one_until_both_are_idle(pools, tmp_path):
    """A pool hands out only workers known to be idle: one that holds a request, and one
    stopped (SIGSTOP) so that it cannot say, are refused by name; once both answer idle, the
    draw hands them out."""
    backend, case = MockerBackend(), LONG
    roles = backend.roles(case.topology)
    pool = pools.pool_for(backend, case, roles)
    deployment = Deployment(backend, case, tmp_path, policy(case.policy), roles, pool)
    try:
        deployment.start(Deadline(60))
        shape = backend.shape(case)
        request = Request(case.api, True, deployment.model.name, shape.prompt, shape.max_tokens)
        inflight = InFlight(deployment.base_url, request, read_timeout_s=60)
        holder = faults.find_holder(backend, deployment.workers, inflight, Deadline(30))
        (idle,) = [w for w in deployment.workers if w is not holder]
        with pytest.raises(Timeout, match=f"idle; last seen: {holder.name} holds a request$"):
            pool.draw(case, Deadline(0))
        idle.process.freeze(Deadline(10))
        try:
            with pytest.raises(Timeout, match=rf"from {idle.name} \(port \d+: ReadTimeout\)"):
                pool.draw(case, Deadline(0))
        finally:
            idle.process.signal_tree(signal.SIGCONT)
        poll_until(
            lambda: (True if inflight.finished else None, inflight.response.summary()),
            Deadline(30),
            "the response to end",
        )
        assert pool.draw(case, Deadline(10)) == deployment.workers
    finally:
        assert deployment.stop() == []


def test_a_pools_cases_get_distinct_prompts_no_cached_prefix(pools, tmp_path, monkeypatch):
    """The mocker reports a prefix it already holds as `cached_tokens` in the usage, in whole
    KV blocks (most of the second case's prompt when it reuses the first's). Two kv_transfer
    cases of one pool send their long prompts through the pool's one prefill worker: the
    second finds nothing of the first's cached."""
    sent: list[InFlight] = []

    class Recorded(InFlight):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            sent.append(self)

    monkeypatch.setattr("handoff.responses.single.InFlight", Recorded)
    cases = [Case.from_id(f"worker_failure-{api}-tcp", "kv_transfer")
             for api in ("chat-stream", "completion-unary")]  # fmt: skip
    results = [run_case(MockerBackend(), c, tmp_path / str(n), SETTINGS, 60, pools=pools)
               for n, c in enumerate(cases)]  # fmt: skip
    assert all(not r.verdict.reasons for r in results), [r.verdict.reasons for r in results]
    assert ready(results[1])["pool"] == ready(results[0])["pool"]
    assert ready(results[1])["cases_before"] == 1
    usages = [inflight.response.usage for inflight in sent]
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0, 0], usages


def test_keep_logs_keeps_a_passed_pools_worker_logs(tmp_path):
    pools = Pools(tmp_path / "pools", keep_logs=True)
    passed = run_case(MockerBackend(), FIRST, tmp_path / "case", SETTINGS, 60, pools=pools)
    assert not passed.verdict.reasons, passed.verdict.summary()
    folder = pools.current[1].folder
    assert pools.close() == []
    logs = sorted(p.name for p in folder.glob("*.log"))
    assert [n for n in logs if n.startswith("worker-")] and "frontend.log" not in logs


def test_a_dead_workers_entries_would_fail_the_next_case_and_the_pool_removes_them(
    pools, tmp_path, monkeypatch
):
    """Without the removal, the second case's frontend lists the worker the first case
    killed (its lease has seconds to run) and the case fails, naming it; with it, it passes."""
    backend = MockerBackend()
    monkeypatch.setattr(pool_module.registrations, "remove", lambda store, ids: [])
    first = run_case(backend, FIRST, tmp_path / "first", SETTINGS, 60, pools=pools)
    assert not first.verdict.reasons, first.verdict.summary()
    stale = run_case(backend, SECOND, tmp_path / "stale", SETTINGS, 60, pools=pools)
    assert not stale.verdict.passed
    (reason,) = stale.verdict.reasons
    assert "that are none of this case's workers" in reason and "stale registration" in reason
    assert pools.current is None  # the failed case took its pool down

    monkeypatch.undo()
    again = run_case(backend, FIRST, tmp_path / "again", SETTINGS, 60, pools=pools)
    clean = run_case(backend, SECOND, tmp_path / "clean", SETTINGS, 60, pools=pools)
    assert not again.verdict.reasons and not clean.verdict.reasons, clean.verdict.summary()
    assert ready(clean)["pool"] == ready(again)["pool"] != ready(first)["pool"]


def test_a_failed_case_discards_its_pool_and_keeps_every_log(pools, tmp_path):
    backend = MockerBackend()
    off = POLICIES["migration_disabled"]
    failed = run_case(backend, FIRST, tmp_path / "failed", SETTINGS, 60, off, pools=pools)
    assert not failed.verdict.passed
    name = ready(failed)["pool"]
    kept = tmp_path / "failed" / f"pool-{name}"
    logs = sorted(p.name for p in kept.glob("*.log"))
    assert logs and all(n.startswith(("worker-", "nats", "preloader")) for n in logs)
    assert (tmp_path / "failed" / "frontend.log").exists()
    assert any(e.name == "pool_discarded" for e in failed.history.events)

    after = run_case(backend, SECOND, tmp_path / "after", SETTINGS, 60, pools=pools)
    assert not after.verdict.reasons, after.verdict.summary()
    assert ready(after)["pool"] != name and ready(after)["cases_before"] == 0


def test_a_wall_clock_step_is_named_and_its_pool_serves_no_later_case(pools, tmp_path, monkeypatch):
    """The harness's reading of the wall clock steps once the pool exists (the machine's clock
    is left alone): the case passes, its leases being intact, but says so, and its pool, whose
    leases a real step may have ended, is gone before the next case."""
    backend = MockerBackend()
    watched = pools.pool_for(backend, FIRST, backend.roles(FIRST.topology))
    ahead = SimpleNamespace(
        time_ns=lambda: time.time_ns() + 24_100_000_000,
        monotonic_ns=time.monotonic_ns,
        get_clock_info=time.get_clock_info,
    )
    monkeypatch.setattr(wallclock, "time", ahead)

    stepped = run_case(backend, FIRST, tmp_path / "stepped", SETTINGS, 60, pools=pools)
    assert not stepped.verdict.reasons, stepped.verdict.summary()
    assert stepped.verdict.notes[-1].startswith("the machine's wall clock stepped +24.1 s")
    names = [e.name for e in stepped.history.events]
    assert names.index("wall_clock_stepped") < names.index("pool_discarded")
    assert ready(stepped)["pool"] == watched.name

    after = run_case(backend, SECOND, tmp_path / "after", SETTINGS, 60, pools=pools)
    assert not after.verdict.reasons, after.verdict.summary()
    assert ready(after)["pool"] != watched.name and ready(after)["cases_before"] == 0
    assert "wall_clock_stepped" not in [e.name for e in after.history.events]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [((), "main-1-mocker-aggregate+aggregate-nats-"), (("--handoff-fresh",), "fresh")],
)
def test_the_results_say_whether_each_case_ran_on_a_pool_or_fresh(tmp_path, flags, expected):
    logs = tmp_path / "runs"
    command = [
        sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification", "-q",
        "-p", "no:cacheprovider", "--handoff-backend", "mocker",
        "-k", "aggregate and nats and worker_failure",
        "--handoff-logs", str(logs), *flags,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    (run_dir,) = logs.iterdir()
    cases = RunResults.load(run_dir).cases
    assert len(cases) == 2
    assert all(c.pool.startswith(expected) for c in cases), [c.pool for c in cases]
    assert all(len(c.workers) == 2 for c in cases)


class DetachingMocker(DetachedChild, MockerBackend):
    """The mocker, each of its workers leaving a detached child that holds a leased port."""


def test_a_faulted_workers_detached_child_fails_its_own_pooled_case(pools, tmp_path, monkeypatch):
    """The worker a pooled case faulted left a child holding one of its ports: that case fails
    (its verdict, history, record and report), not the pool's teardown at the end of the run;
    the others' children, whose workers still ran, are found when the pool goes with it."""
    monkeypatch.setattr(pool_module, "TEARDOWN_TIMEOUT_S", 1.0)  # the bound ports are polled to
    backend = DetachingMocker()
    pool = pools.pool_for(backend, FIRST, backend.roles(FIRST.topology))  # the case's own
    try:
        result = run_case(backend, FIRST, tmp_path / "case", SETTINGS, 60, pools=pools)
        assert not result.verdict.passed
        strays = strays_under(tmp_path / "case")  # the discarded pool's folder moved there
        assert len(strays) == 4, strays  # the drawn two, the spare, the fault's successor
        faulted = next(e.data["worker"] for e in result.history.events if e.name == "fault_sent")
        argv = next(p.argv for p in pool.processes if p.name == faulted)
        port = int(argv[argv.index(DETACH) + 1])  # the port its child was told to hold
        mine = f"port {port} still bound 1 s after teardown, by pid {strays[port]} ("
        assert [r for r in result.verdict.reasons if r.startswith(mine)], result.verdict.reasons
        teardown = next(e.data for e in result.history.events if e.name == "teardown_done")
        assert len(teardown["problems"]) == 1 and teardown["problems"][0].startswith(mine)
        discarded = next(e.data for e in result.history.events if e.name == "pool_discarded")
        others = " ".join(discarded["problems"])
        assert all(f"port {p} still bound" in others for p in strays if p != port)
        assert pools.current is None

        record = CaseRecord.of(result)
        assert not record.passed and record.reasons == result.verdict.reasons
        run_dir = tmp_path / "run"
        RunResults("mocker", "test", str(run_dir), result.seconds, [record]).write()
        assert report.report(run_dir) == 1
    finally:
        kill_strays(tmp_path)


class RaisingMocker(MockerBackend):
    """A backend with a defect: its holder detector raises once a worker holds the request."""

    def holders(self, workers):
        if busy := super().holders(workers):
            raise ValueError(f"a defect, with {busy[0].name} holding the request")
        return busy


def test_an_exception_mid_case_fails_that_case_and_the_next_runs_on_a_new_pool(pools, tmp_path):
    failed = run_case(RaisingMocker(), FIRST, tmp_path / "failed", SETTINGS, 60, pools=pools)
    assert not failed.verdict.passed and failed.verdict.phase == "request_sent"
    (reason,) = failed.verdict.reasons
    found = re.fullmatch(rf"ValueError at {re.escape(__file__)}:(\d+): a defect, with .+", reason)
    assert found, reason
    assert "raise ValueError" in linecache.getline(__file__, int(found[1]))
    assert CaseRecord.of(failed).reasons == [reason]
    discarded = next(e.data for e in failed.history.events if e.name == "pool_discarded")
    assert discarded["problems"] == [] and pools.current is None
    assert not [pid for pid in ready(failed)["pids"].values() if psutil.pid_exists(pid)]

    after = run_case(MockerBackend(), SECOND, tmp_path / "after", SETTINGS, 60, pools=pools)
    assert not after.verdict.reasons, after.verdict.summary()
    assert ready(after)["pool"] != ready(failed)["pool"] and ready(after)["cases_before"] == 0


def health_ids(deployment) -> set[int]:
    health = requests.get(deployment.base_url + "/health", timeout=2).json()
    return {instance["instance_id"] for instance in health.get("instances", [])}


def unlisted(deployment, ids: set[int]):
    """A probe: whether the frontend's /health lists none of `ids`."""

    def probe():
        seen = health_ids(deployment)
        return (None if ids & seen else True), f"/health instances {sorted(seen)}"

    return probe


def test_a_spare_drained_by_sigterm_leaves_the_running_frontend_as_a_worker_started_there(
    tmp_path,
):
    """A spare handed over registers in a folder of its own; what it deletes there when it
    drains is deleted in the pool's folder too, so the case's frontend stops listing it as fast
    as it stops listing a worker started in the pool's folder (as a fresh case's are). Without
    that it stays listed until its entries' lease runs out, 10 s."""
    backend = MockerBackend()
    roles = backend.roles(LONG.topology)
    pools = Pools(tmp_path / "pools", planned=Counter({PoolKey.of(backend, LONG, roles): 2}))
    first = run_case(backend, LONG, tmp_path / "first", SETTINGS, 60, pools=pools)
    assert not first.verdict.reasons, first.verdict.summary()
    pool = pools.pool_for(backend, LONG, roles)
    deployment = Deployment(backend, LONG, tmp_path / "second", policy(LONG.policy), roles, pool)
    try:
        deployment.start(Deadline(60))
        (spare,) = [w for w in deployment.workers if w.name in pool.own_store]
        (native,) = [w for w in deployment.workers if w is not spare]
        for worker in (native, spare):
            ids = pool.instance_ids[worker.name]
            assert ids <= health_ids(deployment)
            worker.process.signal_leader(signal.SIGTERM)  # the graceful fault's
            poll_until(
                unlisted(deployment, ids),
                Deadline(3),
                f"the frontend to stop listing {worker.name}, drained, instance {sorted(ids)}",
            )
    finally:
        assert deployment.stop() == []
    assert pools.close() == []
