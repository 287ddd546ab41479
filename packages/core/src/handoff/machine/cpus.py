"""CPU slots: how many CPUs this process may use, which cases share by what each keeps busy
(`Backend.cpus_per_case`; handoff.sharing.scheduling divides).

A slot is one whole CPU. The count is the smaller of the CPUs in this process's affinity mask
(`os.sched_getaffinity`, which taskset and container cpusets narrow) and the CPU quota of its
cgroup and the cgroups above it (v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`),
rounded down, and at least one. `os.cpu_count()`, which pytest-xdist's `-n auto` uses, sees
neither the mask nor the quota: in a container limited to 2 CPUs on a 64-core host it says 64.

HANDOFF_CPU_SLOTS=N sets the number of cases instead, for whoever oversubscribes on purpose (a
benchmark may want -n 8 on 2 CPUs).

Only the standard library is used.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from handoff.errors import HandoffError

SLOTS_ENV = "HANDOFF_CPU_SLOTS"
CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class Slots:
    count: int
    why: str  # what limits the count, e.g. "2 CPUs in this process's affinity"
    #: Set by HANDOFF_CPU_SLOTS: a number of cases, not of CPUs.
    chosen: bool = False


def affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _v2_quota(text: str) -> float | None:
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return int(parts[0]) / int(parts[1])


def _v1_quota(quota_text: str, period_text: str) -> float | None:
    quota, period = int(quota_text), int(period_text)
    return quota / period if quota > 0 and period > 0 else None


def _upwards(root: Path, path: str) -> list[Path]:
    """root/path and each folder above it up to root (the mount may hide the outer levels,
    in a container; then root itself is the container's own cgroup)."""
    parts = [p for p in path.strip("/").split("/") if p]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_quota(
    root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP
) -> tuple[float, str] | None:
    """The tightest CPU quota over this process's cgroup and its ancestors, in CPUs, with the
    file it came from; None when no quota is set or cgroups cannot be read."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[tuple[float, str]] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2
            for folder in _upwards(root, path):
                quota = _read(folder / "cpu.max", _v2_quota)
                if quota is not None:
                    found.append((quota, str(folder / "cpu.max")))
        elif "cpu" in controllers.split(","):  # cgroup v1
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                if not mount.is_dir():
                    continue
                for folder in _upwards(mount, path):
                    try:
                        quota = _v1_quota(
                            (folder / "cpu.cfs_quota_us").read_text(),
                            (folder / "cpu.cfs_period_us").read_text(),
                        )
                    except (OSError, ValueError):
                        continue
                    if quota is not None:
                        found.append((quota, str(folder / "cpu.cfs_quota_us")))
                break
    return min(found) if found else None


def _read(path: Path, parse) -> float | None:
    try:
        return parse(path.read_text())
    except (OSError, ValueError, ZeroDivisionError):
        return None


def cpu_slots(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> Slots:
    """How many cases may run at once here, and what sets that number."""
    if chosen := os.environ.get(SLOTS_ENV):
        if not chosen.isdigit() or int(chosen) < 1:
            raise HandoffError(f"{SLOTS_ENV}={chosen!r} is not a whole number of slots above 0")
        return Slots(int(chosen), f"{SLOTS_ENV}={chosen}", chosen=True)
    cpus = affinity()
    quota = cgroup_quota(root, self_cgroup)
    if quota is not None and math.floor(quota[0]) < cpus:
        count = max(1, math.floor(quota[0]))
        return Slots(count, f"a CPU quota of {quota[0]:g} CPUs ({quota[1]})")
    return Slots(cpus, f"{cpus} CPUs in this process's affinity")
