"""The pytest side of VRAM scheduling, in an in-process pytest with a substitute NVML and a
case runner that only records what it saw: longest first, each GPU case on the GPU the ledger
gave it (CUDA_VISIBLE_DEVICES) and released after, oversize cases skipped with the reason,
mocker cases untouched, -n cut to the CPU slots, and the dry-run plan."""

import os
import sys

import pytest
from fake_nvml import FakeNvml

from handoff import pytest_plugin
from handoff.backend import Launch
from handoff.gpu_backend import DynamoGpuBackend
from handoff.history import History
from handoff.machine.cpus import Slots
from handoff.machine.ports import LEASE_DIR_ENV
from handoff.pool import PoolKey
from handoff.runner import CaseResult
from handoff.sharing import scheduling
from handoff.sharing.vram_ledger import RESERVATION_ENV, GpuLedger
from handoff.verdict import Verdict
from handoff_mocker import MockerBackend

pytest_plugins = ["pytester"]

VRAM = {"aggregate": 4.8, "decode": 6.8, "kv_transfer": 30.0, "prefill": 0.0}
TIMEOUTS = {"aggregate": 100.0, "decode": 300.0, "kv_transfer": 200.0, "prefill": 50.0}


class FakeGpuBackend(MockerBackend):
    """The mocker's cases with GPU markers, whose workers (where a test's runner starts pools)
    only sleep: real processes, started and stopped by real pools."""

    name = "fakegpu"
    cpus_per_case = 1.0
    restrictions = DynamoGpuBackend.restrictions  # the GPU engines' cases: no stall yet
    topologies = {t: roles for t, roles in MockerBackend.topologies.items() if t in VRAM}

    def check_environment(self) -> None:
        pass

    def markers(self, case):
        topology = case.topology
        return {"handoff_timeout": TIMEOUTS[topology], "profiled_vram_gib": VRAM[topology]}

    def worker(self, role, case, model, ports, folder):
        return Launch([sys.executable, "-c", "import time; time.sleep(600)"])


def pool_label(backend, case) -> str:
    return PoolKey.of(backend, case, backend.roles(case.topology)).label


def machine_of_the_test(monkeypatch, tmp_path) -> tuple[FakeNvml, list[int]]:
    """No CUDA variables, the test's own lease and state folders, two CPU slots and a GPU of
    24 GiB; the backend named "fakegpu" is `FakeGpuBackend` on the mocker's settings. The
    GPU, and a list that grows each time it is opened."""
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(scheduling, "cpu_slots", lambda: Slots(2, "2 CPUs in the test's mask"))
    nvml = FakeNvml(24, 24)
    opened: list[int] = []
    monkeypatch.setattr(scheduling, "open_nvml", lambda: opened.append(1) or nvml)
    real = pytest_plugin.configured_backend

    def configured(name, overrides=None, start=None):
        backend = real("mocker", overrides, start)
        if name == "fakegpu":
            fake = FakeGpuBackend()
            fake.configure(backend.configuration)
            return fake
        return backend

    monkeypatch.setattr(pytest_plugin, "configured_backend", configured)
    return nvml, opened


@pytest.fixture
def run(pytester, monkeypatch, tmp_path):
    """An in-process qualification run; returns (result, what each case saw)."""
    nvml, opened = machine_of_the_test(monkeypatch, tmp_path)
    seen = []

    def run_case(backend, case, folder, settings, timeout_s, pools=None):
        env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
        held = [(r.key, r.gpu) for r in GpuLedger(nvml, folder=tmp_path / "leases").held()]
        seen.append((case.key, env, held, pool_label(backend, case)))
        return CaseResult(case, Verdict(True, [], "verdict"), 0.1, folder, History())

    def pooled_case(backend, case, folder, settings, timeout_s, pools=None):
        """Draw the case's pool as the runner does, starting it if new; count the draw (the
        sleepers never register, so `draw` would wait); record what the case runs under."""
        pool = pools.pool_for(backend, case, backend.roles(case.topology))
        if not pool.started:
            pool.start()
        pool.draws += 1
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        held = [(r.token, r.key, r.gpu) for r in GpuLedger(nvml, folder=tmp_path / "leases").held()]
        names = ("CUDA_VISIBLE_DEVICES", RESERVATION_ENV)
        seen.append((case.key, pool.name, env, tuple(pool.env.get(k) for k in names), held))
        verdict = Verdict(case.key not in failing, ["failed on purpose"], "verdict")
        if not verdict.passed:  # as the runner does: the pool goes with the failed case
            pools.discard(pool)
        return CaseResult(case, verdict, 0.1, folder, History())

    failing: set[str] = set()

    # The suite's module may be imported afresh by the inner run (pytester drops the modules a
    # run imported): patch the runner it imports from, and the module if it is loaded.
    def go(backend, *args, pooled=False, fail=()):
        runner = pooled_case if pooled else run_case
        failing.update(fail)
        monkeypatch.setattr("handoff.runner.run_case", runner)
        monkeypatch.setattr("handoff.qualification.run_case", runner)
        result = pytester.runpytest_inprocess(
            # The plugins the repository's addopts leave out (pyproject.toml): loaded late in
            # this process, hypothesis's warns.
            "--pyargs", "handoff.qualification", "-p", "no:cacheprovider", "-p", "no:anyio",
            "-p", "no:hypothesispytest", "--handoff-backend", backend,
            "--handoff-logs", str(tmp_path / "runs"), *args,
        )  # fmt: skip
        return result, seen, opened, nvml

    return go


def test_gpu_cases_run_longest_first_on_the_gpu_they_were_given(run, tmp_path):
    result, seen, _, nvml = run("fakegpu", "--max-vram-gib", "8")
    result.assert_outcomes(passed=16, skipped=2)
    topologies = [key.split("/")[0] for key, *_ in seen]
    assert topologies == ["decode"] * 4 + ["aggregate"] * 8 + ["prefill"] * 4
    for key, env, held, pool in seen:
        if key.startswith("prefill/"):  # 0 GiB: a CPU slot only, no GPU, no reservation
            assert env == {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": None}
            assert held == []
        else:  # held for the case's pool, which this runner never starts: gone with the case
            assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
            assert held == [(pool, int(env["CUDA_VISIBLE_DEVICES"]))]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # put back after each case
    assert GpuLedger(nvml, folder=tmp_path / "leases").held() == []  # all released
    out = result.stdout.str()
    assert "handoff: 2 cases not run, over the VRAM budget:" in out
    assert (
        "    kv_transfer/graceful_shutdown-chat-unary-tcp: profiled_vram_gib(30) is more than "
        "any GPU here may hold for one case (GPU 0: 8.0 GiB (budget), GPU 1: 8.0 GiB (budget)) "
        "under --max-vram-gib 8"
    ) in out


def test_mocker_cases_run_as_before_without_reading_nvml(run):
    result, seen, opened, _ = run("mocker")
    result.assert_outcomes(passed=68)
    assert len(seen) == 68 and opened == []
    assert all(env["CUDA_VISIBLE_DEVICES"] is None and held == [] for _, env, held, _ in seen)
    keys = [key for key, *_ in seen]
    # Equal timeouts: the selection's own order, pool by pool. The abandoned cases run on the
    # aggregate's workers: they take their turns in its pools. A guided request's workers
    # replay no output of their own (handoff_mocker.origins), nor do decode's and prefill's;
    # a rolling case's replay as long an output as some load cases'. The discovery cases run
    # on etcd pools of their own, wherever their timeouts put them.
    topologies = [k.split("/")[0] for k in keys]
    assert topologies.count("discovery") == 6
    topologies = [t for t in topologies if t != "discovery"]
    last_aggregate = len(topologies) - topologies[::-1].index("aggregate")
    assert set(topologies[:last_aggregate]) == {"aggregate", "abandoned"}
    assert list(dict.fromkeys(topologies[last_aggregate:])) == [
        "decode", "kv_transfer", "prefill", "guided", "load", "rolling", "join"
    ]  # fmt: skip


def test_a_pools_reservation_lives_as_long_as_its_workers_and_its_cases_run_on_its_gpu(
    run, monkeypatch, tmp_path
):
    """Real pools of sleeping workers on one GPU whose budget (8 GiB) holds one pool at a
    time: each pool reserves once, for its first case; its later cases take no reservation
    and run on its GPU; it is released when its workers stop (the next key's pool replaced
    it, or a failed case discarded it), and the next pool reserves while the last one's
    workers still run (they stop before its own start): no wait, no deadlock."""
    monkeypatch.setitem(TIMEOUTS, "decode", 0.4)  # short: a case that waits fails soon
    monkeypatch.setitem(TIMEOUTS, "aggregate", 0.3)
    monkeypatch.setattr(scheduling, "MIN_WAIT_S", 1.0)
    monkeypatch.setitem(TIMEOUTS, "kv_transfer", 0.5)
    monkeypatch.setitem(TIMEOUTS, "prefill", 0.5)  # a wait of 7 s in all, then a failure
    one_gpu = FakeNvml(24)
    monkeypatch.setattr(scheduling, "open_nvml", lambda: one_gpu)
    failed = "aggregate/migration_enabled-worker_failure-chat-stream-nats"
    result, seen, _, nvml = run("fakegpu", "--max-vram-gib", "8", pooled=True, fail=[failed])
    result.assert_outcomes(passed=15, failed=1, skipped=2)
    pools: dict[str, list] = {}  # each pool's cases, in order
    for key, pool, env, pool_env, held in seen:
        pools.setdefault(pool, []).append((key, env, pool_env, held))
    tokens = []
    for pool, cases in pools.items():
        first_key, _, _, first_held = cases[0]
        if first_key.startswith("prefill/"):  # 0 GiB: nothing held, the last pool's released
            assert all(c[1:] == (None, (None, None), []) for c in cases)
            continue
        [(token, label, gpu)] = first_held  # the pool's reservation, and no other
        assert pool.endswith(label)
        for key, env, pool_env, held in cases:  # each case: no other, on the pool's GPU
            assert (env, pool_env, held) == (str(gpu), (str(gpu), token), first_held), key
        tokens.append(token)
    assert len(tokens) == len(set(tokens)) >= 4  # a reservation of its own for each pool
    # The failed case discarded its pool: the next case of its key started and reserved anew.
    at = [key for key, *_ in seen].index(failed)
    assert pools[seen[at][1]][-1][0] == failed
    assert seen[at + 1][1] != seen[at][1] and seen[at + 1][1].endswith(label_of(failed, seen))
    assert GpuLedger(nvml, folder=tmp_path / "leases").held() == []  # all pools stopped


def label_of(key: str, seen: list) -> str:
    """The pool label that `key`'s case held its reservation for."""
    return next(held[0][1] for k, *_, held in seen if k == key)


def test_the_dry_run_prints_the_plan_and_starts_nothing(run):
    result, seen, _, _ = run("fakegpu", "--max-vram-gib", "8", "--handoff-dry-run", "-n", "4")
    assert result.ret == 0
    assert seen == []
    out = result.stdout.str()
    assert (
        "handoff: 4 xdist workers asked for, 2 started: 2 CPUs in the test's mask, 1 CPUs a case"
        in out
    )
    assert "handoff plan (dry run: nothing started)" in out
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#  start s"))
    rows = [line.split() for line in lines[first + 1 : first + 17]]
    # order, start, slot, GPU, GiB, case, timeout: decode first, two at a time on two slots.
    assert [r[0] for r in rows] == [str(n) for n in range(1, 17)]
    assert [(r[2], r[3], r[4]) for r in rows[:2]] == [("1", "0", "6.8"), ("2", "1", "6.8")]
    assert {r[5].split("/")[0] for r in rows[:4]} == {"decode"}
    assert {r[3] for r in rows if r[5].startswith("prefill/")} == {"-"}
    assert "16 cases on 2 CPU slots" in out
    assert "not run: kv_transfer/graceful_shutdown-chat-unary-tcp: profiled_vram_gib(30)" in out


def test_more_workers_than_cpu_slots_are_not_started(run):
    result, *_ = run("mocker", "-n", "17", "--collect-only")
    # A mocker case keeps 0.125 of a CPU busy: sixteen fit on two CPUs, the 17th does not.
    assert (
        "handoff: 17 xdist workers asked for, 16 started: 2 CPUs in the test's mask, "
        "0.125 CPUs a case" in result.stdout.str()
    )


def test_n_auto_starts_as_many_workers_as_fit_the_cpu_slots(run):
    """xdist's own -n auto counts physical cores (2 here), one case each; a mocker case
    mostly waits, so sixteen fit."""
    result, *_ = run("mocker", "-n", "auto", "--collect-only")
    assert (
        "handoff: -n auto starts 16 xdist workers: 2 CPUs in the test's mask, 0.125 CPUs a case"
        in result.stdout.str()
    )


def test_no_more_workers_start_than_cases_are_selected(run):
    """Sixteen would fit; three cases selected need three workers, whether asked by -n auto
    or by a number."""
    names = [
        "migration_enabled-worker_failure-chat-stream-nats",
        "migration_disabled-worker_failure-chat-unary-tcp",
        "migration_enabled-worker_stall-chat-stream-nats",
    ]
    three = ["--handoff-topology", "aggregate"] + [f"--handoff-case={n}" for n in names]
    result, *_ = run("mocker", "-n", "auto", "--collect-only", *three)
    assert (
        "handoff: -n auto starts 3 xdist workers: 2 CPUs in the test's mask, 0.125 CPUs a "
        "case, 3 cases selected" in result.stdout.str()
    )
    result, *_ = run("mocker", "-n", "8", "--collect-only", *three)
    assert "handoff: 8 xdist workers asked for, 3 started:" in result.stdout.str()


def test_dealt_gives_each_worksteal_share_one_of_the_longest_cases():
    """Longest first, dealt back and forth: worksteal's contiguous shares, the smaller first
    (13 items on 4 workers: 3, 3, 3, 4), each begin with one of the longest cases."""
    lengths = [37, 25, 25, 22, 11, 10, 10, 7, 6, 5, 3, 2, 1]
    order = scheduling.dealt(lengths, 4)  # items are only reordered: any objects do
    shares = [order[0:3], order[3:6], order[6:9], order[9:13]]
    assert sorted(share[0] for share in shares) == [22, 25, 25, 37]
    assert all(share == sorted(share, reverse=True) for share in shares)
    assert sorted(order) == sorted(lengths)
