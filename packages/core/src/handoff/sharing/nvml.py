"""NVML behind a small interface: the GPUs this process may use, their memory, and how much each
process uses. The scheduler, the ledger and the profiler read GPUs only through `Nvml`, so a
test hands them a substitute and no test needs a GPU.

- `Device`: one GPU as NVML enumerates it (PCI bus order): index, UUID, name, total and used
  bytes. `used` is the device total NVML reports, which is not zero on an idle GPU (the driver
  holds about 615 MiB on an H200): count from a baseline, never from zero.
- `ProcessUse`: the bytes one process uses on one GPU. `Nvml.processes(index)` is None where
  the platform does not tell (no per-process accounting, or no permission). Inside a container
  without the host's pid namespace NVML reports host pids, which mean nothing here: callers
  check the pids before trusting them.
- `open_nvml()`: the real NVML, or `GpuUnavailable` (a HandoffError) with the reason in one
  line: nvidia-ml-py missing, no driver answering, or no GPU visible.

Which GPUs: NVML ignores CUDA_VISIBLE_DEVICES, CUDA does not. Where the variable is set, only
the GPUs it names (by index, or by `GPU-<uuid>` prefix, up to the first entry CUDA would reject)
are listed, so handoff never places a case on a GPU its environment hid. `cuda_env(index)`
is the environment that gives a case that GPU and no other: CUDA_DEVICE_ORDER=PCI_BUS_ID makes
CUDA's index the NVML index (CUDA's default order, fastest first, differs on mixed machines).
MIG instances are not handled: a `MIG-` entry ends the list as an unknown one does.

Only the standard library and, when present, pynvml are imported here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from handoff.errors import HandoffError

GIB = 1024**3
MIB = 1024**2
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
ORDER_ENV = "CUDA_DEVICE_ORDER"


class GpuUnavailable(HandoffError):
    """No GPU can be read here; the message says why (no pynvml, no driver, none visible)."""


@dataclass(frozen=True)
class Device:
    index: int  # NVML's index, in PCI bus order
    uuid: str
    name: str
    total: int  # bytes
    used: int  # bytes, as the device reports it (the driver's own share included)


@dataclass(frozen=True)
class ProcessUse:
    pid: int
    device: int  # Device.index
    used: int  # bytes


class Nvml(Protocol):
    """What handoff reads from NVML; substitute it in tests."""

    def devices(self) -> list[Device]: ...

    def processes(self, index: int) -> list[ProcessUse] | None: ...

    def close(self) -> None: ...


def visible(devices: Sequence[Device], spec: str | None) -> list[Device]:
    """The devices a CUDA_VISIBLE_DEVICES value `spec` leaves visible (all when unset), in the
    order it names them. CUDA stops at the first entry it cannot resolve; so does this."""
    if spec is None:
        return list(devices)
    chosen: list[Device] = []
    for entry in (e.strip() for e in spec.split(",")):
        match = None
        if entry.lstrip("-").isdigit():
            match = next((d for d in devices if d.index == int(entry)), None)
        elif entry.startswith("GPU-"):
            found = [d for d in devices if d.uuid.startswith(entry)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


def cuda_env(index: int) -> dict[str, str]:
    """The environment that shows a case's processes the GPU of NVML index `index`, no other."""
    return {ORDER_ENV: "PCI_BUS_ID", VISIBLE_ENV: str(index)}


class PynvmlNvml:
    """The real NVML through pynvml (nvidia-ml-py). Open it with `open_nvml()`."""

    def __init__(self, module) -> None:
        self._nvml = module
        self._handles: dict[int, object] = {}

    def _handle(self, index: int):
        if index not in self._handles:
            self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def devices(self) -> list[Device]:
        nvml = self._nvml
        found = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = self._handle(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(
                Device(
                    index,
                    _text(nvml.nvmlDeviceGetUUID(handle)),
                    _text(nvml.nvmlDeviceGetName(handle)),
                    int(memory.total),
                    int(memory.used),
                )
            )
        return visible(found, os.environ.get(VISIBLE_ENV))

    def processes(self, index: int) -> list[ProcessUse] | None:
        try:
            listed = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle(index))
        except self._nvml.NVMLError:
            return None
        uses = []
        for p in listed:
            used = getattr(p, "usedGpuMemory", None)
            if used is None:  # the platform does not account per process
                return None
            uses.append(ProcessUse(int(p.pid), index, int(used)))
        return uses

    def close(self) -> None:
        self._handles.clear()
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_nvml() -> PynvmlNvml:
    """The real NVML, initialised, with at least one visible GPU; or GpuUnavailable."""
    try:
        import pynvml
    except ImportError as exc:
        raise GpuUnavailable(
            "no GPU can be read: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        ) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise GpuUnavailable(f"no GPU can be read: no NVIDIA driver answers (NVML: {exc})") from exc
    source = PynvmlNvml(pynvml)
    try:
        listed = source.devices()
    except pynvml.NVMLError as exc:
        source.close()
        raise GpuUnavailable(f"no GPU can be read: NVML failed to list GPUs ({exc})") from exc
    if not listed:
        source.close()
        spec = os.environ.get(VISIBLE_ENV)
        hidden = f" ({VISIBLE_ENV}={spec!r} hides every GPU)" if spec is not None else ""
        raise GpuUnavailable(f"no GPU can be read: the NVIDIA driver lists no GPU{hidden}")
    return source


def gib(nbytes: float) -> float:
    return nbytes / GIB
