"""The pytest side of VRAM scheduling, in an in-process pytest with a substitute NVML and a
case runner that only records what it saw: longest first, each GPU case on the GPU the ledger
gave it (CUDA_VISIBLE_DEVICES) and released after, oversize cases skipped with the reason,
mocker cases untouched, -n cut to the CPU slots, and the dry-run plan."""

import os

import pytest
from fake_nvml import FakeNvml

from handoff import pytest_plugin
from handoff.history import History
from handoff.machine.ports import LEASE_DIR_ENV
from handoff.runner import CaseResult
from handoff.sharing import scheduling
from handoff.sharing.cpus import Slots
from handoff.sharing.vram_ledger import GpuLedger
from handoff.verdict import Verdict
from handoff_mocker import MockerBackend

pytest_plugins = ["pytester"]

VRAM = {"aggregate": 4.8, "decode": 6.8, "kv_transfer": 30.0, "prefill": 0.0}
TIMEOUTS = {"aggregate": 100.0, "decode": 300.0, "kv_transfer": 200.0, "prefill": 50.0}


class FakeGpuBackend(MockerBackend):
    """The mocker's cases with GPU markers; never deployed (the runner is replaced)."""

    name = "fakegpu"
    cpus_per_case = 1.0

    def check_environment(self) -> None:
        pass

    def markers(self, case):
        topology = case.topology
        return {"handoff_timeout": TIMEOUTS[topology], "profiled_vram_gib": VRAM[topology]}


@pytest.fixture
def run(pytester, monkeypatch, tmp_path):
    """An in-process qualification run; returns (result, what each case saw)."""
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv(pytest_plugin.RUN_DIR_ENV, str(tmp_path / "run"))
    monkeypatch.setattr(scheduling, "cpu_slots", lambda: Slots(2, "2 CPUs in the test's mask"))
    nvml = FakeNvml(24, 24)
    opened = []
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
    seen = []

    def run_case(backend, case, folder, settings, timeout_s, pools=None):
        env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
        held = [(r.key, r.gpu) for r in GpuLedger(nvml, folder=tmp_path / "leases").held()]
        seen.append((case.key, env, held))
        return CaseResult(case, Verdict(True, [], "verdict"), 0.1, folder, History())

    # The suite's module may be imported afresh by the inner run (pytester drops the modules a
    # run imported): patch the runner it imports from, and the module if it is loaded.
    monkeypatch.setattr("handoff.runner.run_case", run_case)
    monkeypatch.setattr("handoff.qualification.run_case", run_case)

    def go(backend, *args):
        result = pytester.runpytest_inprocess(
            "--pyargs", "handoff.qualification", "-p", "no:cacheprovider",
            "--handoff-backend", backend, *args,
        )  # fmt: skip
        return result, seen, opened, nvml

    return go


def test_gpu_cases_run_longest_first_on_the_gpu_they_were_given(run, tmp_path):
    result, seen, _, nvml = run("fakegpu", "--max-vram-gib", "8")
    result.assert_outcomes(passed=16, skipped=2)
    topologies = [key.split("/")[0] for key, _, _ in seen]
    assert topologies == ["decode"] * 4 + ["aggregate"] * 8 + ["prefill"] * 4
    for key, env, held in seen:
        if key.startswith("prefill/"):  # 0 GiB: a CPU slot only, no GPU, no reservation
            assert env == {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": None}
            assert held == []
        else:
            assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
            assert held == [(key, int(env["CUDA_VISIBLE_DEVICES"]))]
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
    result.assert_outcomes(passed=18)
    assert len(seen) == 18 and opened == []
    assert all(env["CUDA_VISIBLE_DEVICES"] is None and held == [] for _, env, held in seen)
    keys = [key for key, _, _ in seen]
    assert [k.split("/")[0] for k in keys] == sorted(
        (k.split("/")[0] for k in keys), key=["aggregate", "decode", "kv_transfer", "prefill"].index
    )  # equal timeouts: the selection's own order


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
    result, *_ = run("mocker", "-n", "5", "--collect-only")
    # A mocker case keeps half a CPU busy: four fit on two CPUs, the fifth does not.
    assert (
        "handoff: 5 xdist workers asked for, 4 started: 2 CPUs in the test's mask, "
        "0.5 CPUs a case" in result.stdout.str()
    )
