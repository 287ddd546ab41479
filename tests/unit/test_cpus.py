"""CPU slots: the affinity mask and the cgroup CPU quota (v2 and v1), whichever is tighter."""

import os
import subprocess
import sys

import pytest

from handoff.errors import HandoffError
from handoff.machine import cpus


@pytest.fixture
def eight_cpus(monkeypatch):
    monkeypatch.setattr(cpus, "affinity", lambda: 8)
    monkeypatch.delenv(cpus.SLOTS_ENV, raising=False)


def cgroup(tmp_path, line, files):
    (tmp_path / "self").write_text(line + "\n")
    for name, text in files.items():
        path = tmp_path / "fs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "fs", tmp_path / "self"


def test_no_quota_means_the_affinity(tmp_path, eight_cpus):
    root, me = cgroup(tmp_path, "0::/ci.slice/job", {"ci.slice/job/cpu.max": "max 100000\n"})
    assert cpus.cpu_slots(root, me) == cpus.Slots(8, "8 CPUs in this process's affinity")


def test_a_v2_quota_below_the_affinity_sets_the_slots_rounded_down(tmp_path, eight_cpus):
    root, me = cgroup(tmp_path, "0::/ci.slice/job", {"ci.slice/job/cpu.max": "250000 100000\n"})
    slots = cpus.cpu_slots(root, me)
    assert slots.count == 2
    assert slots.why == f"a CPU quota of 2.5 CPUs ({root}/ci.slice/job/cpu.max)"


def test_the_tightest_quota_above_counts_too(tmp_path, eight_cpus):
    root, me = cgroup(
        tmp_path,
        "0::/ci.slice/job",
        {"ci.slice/cpu.max": "300000 100000\n", "ci.slice/job/cpu.max": "max 100000\n"},
    )
    assert cpus.cpu_slots(root, me).count == 3


def test_a_container_sees_its_own_cgroup_at_the_root(tmp_path, eight_cpus):
    # Inside a cgroup namespace the path is "/" and the quota sits at the mount's root.
    root, me = cgroup(tmp_path, "0::/", {"cpu.max": "400000 100000\n"})
    assert cpus.cpu_slots(root, me).count == 4


def test_a_v1_cfs_quota(tmp_path, eight_cpus):
    root, me = cgroup(
        tmp_path,
        "4:cpu,cpuacct:/docker/abc",
        {
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cpus.cpu_slots(root, me).count == 1  # 1.5 CPUs: one whole slot


def test_v1_without_a_quota(tmp_path, eight_cpus):
    root, me = cgroup(
        tmp_path,
        "4:cpu,cpuacct:/",
        {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
    )
    assert cpus.cpu_slots(root, me).count == 8


def test_a_quota_below_one_cpu_still_gives_one_slot(tmp_path, eight_cpus):
    root, me = cgroup(tmp_path, "0::/", {"cpu.max": "50000 100000\n"})
    assert cpus.cpu_slots(root, me).count == 1


def test_unreadable_cgroups_leave_the_affinity(tmp_path, eight_cpus):
    assert cpus.cpu_slots(tmp_path / "none", tmp_path / "none").count == 8


def test_the_affinity_is_the_process_own_not_the_machine():
    """Pinned to one CPU (as a CI job's cpuset pins it), the process gets one slot, however
    many CPUs the machine has."""
    pinned = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
    probe = "from handoff.machine import cpus; print(cpus.affinity(), cpus.cpu_slots().count)"
    env = {k: v for k, v in os.environ.items() if k != cpus.SLOTS_ENV}
    out = subprocess.run(
        [sys.executable, "-c", pinned + probe], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    assert out == ["1", "1"]


def test_slots_set_on_purpose_win(tmp_path, eight_cpus, monkeypatch):
    root, me = cgroup(tmp_path, "0::/", {"cpu.max": "200000 100000\n"})
    monkeypatch.setenv(cpus.SLOTS_ENV, "6")
    assert cpus.cpu_slots(root, me) == cpus.Slots(6, "HANDOFF_CPU_SLOTS=6", chosen=True)
    monkeypatch.setenv(cpus.SLOTS_ENV, "0")
    with pytest.raises(HandoffError, match="HANDOFF_CPU_SLOTS='0' is not a whole number"):
        cpus.cpu_slots(root, me)
