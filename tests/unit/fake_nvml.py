"""A substitute for NVML, for tests only: GPUs whose memory a test sets by hand."""

from __future__ import annotations

from handoff.sharing.nvml import GIB, Device, ProcessUse

IDLE_GIB = 0.6  # what the driver holds on an idle GPU (615 MiB on an H200)


class FakeNvml:
    """GPUs of the given totals (GiB). `use(gpu, pid, gib)` makes a process use memory there;
    `per_process = False` is a platform that does not tell per-process use."""

    def __init__(self, *totals_gib: float, idle_gib: float = IDLE_GIB) -> None:
        self.totals = {i: int(t * GIB) for i, t in enumerate(totals_gib)}
        self.idle = int(idle_gib * GIB)
        self.by_process: dict[int, dict[int, int]] = {i: {} for i in self.totals}
        self.per_process = True
        self.reads = 0
        self.closed = False

    def use(self, gpu: int, pid: int, gib: float) -> None:
        if gib:
            self.by_process[gpu][pid] = int(gib * GIB)
        else:
            self.by_process[gpu].pop(pid, None)

    def devices(self) -> list[Device]:
        self.reads += 1
        return [
            Device(
                i, f"GPU-fake-{i}", "Fake GPU", total, self.idle + sum(self.by_process[i].values())
            )
            for i, total in self.totals.items()
        ]

    def processes(self, index: int) -> list[ProcessUse] | None:
        if not self.per_process:
            return None
        return [ProcessUse(pid, index, used) for pid, used in self.by_process[index].items()]

    def close(self) -> None:
        self.closed = True
