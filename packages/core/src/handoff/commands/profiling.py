"""`handoff profile CASE...` (or `python -m handoff.commands.profiling CASE...`): the GPU memory a
case really uses, measured with NVML, and the markers that follow from it.

- `Sampler`: a thread reading NVML every 100 ms (each visible GPU's used bytes and, where the
  platform gives it, each process's) from before the case starts until after its teardown;
  then until the memory is back within the leak threshold of the baseline, or SETTLE_S passed.
- `profile(samples)`, per GPU: baseline (the first sample, before the case), peak, final (the
  last sample), leak = final - baseline, flagged past the threshold (default 128 MiB), and each
  process's peak where NVML tells it.
- Markers to paste: `profiled_vram_gib` = the largest peak above baseline of any GPU, rounded up
  to 0.1 GiB: the whole deployment, CUDA contexts included, which is what the VRAM ledger
  budgets; `handoff_timeout` = TIMEOUT_FACTOR times the measured wall time, rounded up to 10 s.
- The plot (`vram.png` in the case folder, written by `handoff.sharing.plot` with the standard
  library): GiB above baseline over the seconds since the case started, with the case history's
  fault (`fault_sent`), migration (`migration_seen`) and completion (`response_finished`).

Without a GPU, a driver or pynvml the command prints one line and exits 2; nothing else in
handoff needs NVML. Exit 1 when a case failed or leaked, else 0. The module imports only the
standard library and handoff's NVML-free modules until `main` runs a case (the runner and the
backends are imported there), so the sampler and the report work in a bare Python with pynvml.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from handoff.backend import TIMEOUT_MARKER
from handoff.errors import HandoffError
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.sharing.nvml import GIB, MIB, GpuUnavailable, Nvml, open_nvml
from handoff.sharing.plot import timeline_png

INTERVAL_S = 0.1
SETTLE_S = 5.0
LEAK_MIB = 128.0
TIMEOUT_FACTOR = 3.0
#: History events drawn on the plot, and their labels.
MARKS = {"fault_sent": "FAULT", "migration_seen": "MIGRATION", "response_finished": "DONE"}


@dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    used: dict[int, int]  # GPU index -> bytes used on the device
    processes: dict[int, dict[int, int]]  # GPU index -> pid -> bytes; a GPU absent: not told


class Sampler:
    """NVML read every `interval_s` on a thread, from `start()` to `stop()`; both take a
    sample themselves, so the first is before the case and the last after it."""

    def __init__(
        self,
        nvml: Nvml,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml = nvml
        self.interval_s = interval_s
        self.clock = clock
        self.samples: list[Sample] = []
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Sample:
        devices = self.nvml.devices()
        processes = {}
        for device in devices:
            listed = self.nvml.processes(device.index)
            if listed is not None:
                processes[device.index] = {p.pid: p.used for p in listed}
        taken = Sample(self.clock(), {d.index: d.used for d in devices}, processes)
        with self._lock:
            self.samples.append(taken)
        return taken

    def start(self) -> Sampler:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="handoff-nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        n = 0
        while True:
            n += 1
            # The sampling period: wake on the 100 ms grid, or when stopped.
            if self._stop.wait(max(0.0, started + n * self.interval_s - time.monotonic())):
                return
            try:
                self.sample()
            except Exception as exc:  # NVML went away: keep what was sampled, say why
                self.error = f"sampling stopped: {exc}"
                return

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.snapshot()

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def settle(self, threshold_bytes: float, deadline: Deadline) -> bool:
        """Wait until every GPU is back within `threshold_bytes` of the first sample; False
        if it is not by the deadline (a leak, or memory freed late)."""
        baseline, since = self.samples[0].used, self.clock()

        def back() -> tuple[bool | None, str]:
            fresh = [s for s in self.snapshot() if s.at >= since]  # sampled after the case
            if not fresh:
                return None, "no sample yet"
            latest = fresh[-1].used
            over = {i: latest[i] - baseline.get(i, 0) for i in latest}
            if all(v <= threshold_bytes for v in over.values()):
                return True, ""
            return None, ", ".join(f"GPU {i}: +{v / MIB:.0f} MiB" for i, v in over.items())

        try:
            return poll_until(back, deadline, "GPU memory back at its baseline")
        except Timeout:
            return False


@dataclass(frozen=True)
class GpuProfile:
    index: int
    baseline: int  # bytes
    peak: int
    peak_at: float  # seconds after the first sample
    final: int
    processes: dict[int, int]  # pid -> its peak, where NVML tells
    samples: int

    @property
    def leak(self) -> int:
        return self.final - self.baseline

    @property
    def rise(self) -> int:
        """The peak above the baseline: what the case held at most."""
        return max(0, self.peak - self.baseline)


def profile(samples: Sequence[Sample]) -> list[GpuProfile]:
    """Per GPU: baseline, peak, final and each process's peak, from samples in time order."""
    if not samples:
        return []
    first, last = samples[0], samples[-1]
    profiles = []
    for index in sorted(first.used):
        seen = [(s.at, s.used[index]) for s in samples if index in s.used]
        peak_at, peak = max(seen, key=lambda p: p[1])
        processes: dict[int, int] = {}
        for s in samples:
            for pid, used in s.processes.get(index, {}).items():
                processes[pid] = max(used, processes.get(pid, 0))
        profiles.append(
            GpuProfile(
                index,
                first.used[index],
                peak,
                round(peak_at - first.at, 3),
                last.used.get(index, first.used[index]),
                processes,
                len(seen),
            )
        )
    return profiles


def vram_marker(rise_bytes: float) -> float:
    """profiled_vram_gib: the rise in GiB, rounded up to 0.1 (at least 0.1 when anything rose)."""
    return math.ceil(round(rise_bytes / GIB, 6) * 10) / 10


def timeout_marker(wall_s: float) -> float:
    return float(math.ceil(wall_s * TIMEOUT_FACTOR / 10) * 10)


def report_lines(
    profiles: Sequence[GpuProfile], leak_bytes: float, names: dict[int, str] | None = None
) -> list[str]:
    names = names or {}
    lines = []
    for p in profiles:
        flag = "  LEAK" if p.leak > leak_bytes else ""
        lines.append(
            f"GPU {p.index}: baseline {p.baseline / MIB:,.0f} MiB, peak {p.peak / MIB:,.0f} MiB "
            f"(+{p.rise / MIB:,.0f} MiB at {p.peak_at:.1f} s), final {p.final / MIB:,.0f} MiB, "
            f"leak {p.leak / MIB:+,.0f} MiB{flag} ({p.samples} samples)"
        )
        for pid, peak in sorted(p.processes.items(), key=lambda item: -item[1]):
            lines.append(f"    pid {pid:<8} {names.get(pid, ''):<22} peak {peak / MIB:,.0f} MiB")
    return lines


def marker_lines(key: str, vram_gib: float, timeout_s: float) -> list[str]:
    return [
        f"markers for {key}: profiled_vram_gib({vram_gib:g}) {TIMEOUT_MARKER}({timeout_s:g})",
        f"    in the backend: profiled_vram_gib[{key.split('/')[0]!r}] = {vram_gib:g}, "
        f"timeouts[{key.split('/')[0]!r}] = {timeout_s:g}",
    ]


def plot(
    path: Path,
    samples: Sequence[Sample],
    marks: Sequence[tuple[float, str]],
    title: str,
    budget_gib: float | None = None,
) -> Path:
    """GiB above each GPU's baseline over seconds since the first sample, with `marks`
    (seconds since the first sample, label) and the budget, if any."""
    start = samples[0].at
    series = {
        f"GPU {i}": [(s.at - start, (s.used[i] - samples[0].used[i]) / GIB) for s in samples]
        for i in sorted(samples[0].used)
    }
    limit = (budget_gib, f"BUDGET {budget_gib:g} GIB") if budget_gib else None
    return timeline_png(path, series, marks, title, limit)


def history_marks(events, history_started: float, first_sample: float) -> list[tuple[float, str]]:
    """The fault, migration and completion of a case's history, in seconds since the first
    sample."""
    offset = history_started - first_sample
    return [(e.at + offset, MARKS[e.name]) for e in events if e.name in MARKS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="handoff profile",
        description="Run cases while sampling NVML every 100 ms; report each GPU's baseline, "
        "peak, final and leak, draw vram.png, and print the markers to paste.",
    )
    parser.add_argument("cases", nargs="+", metavar="CASE", help="<topology>/<case id>, or an id")
    parser.add_argument("--backend", default="mocker")
    parser.add_argument(
        "--selection", default="pre_merge", choices=("pre_merge", "nightly", "full")
    )
    parser.add_argument("--logs", default=".handoff/profiles", help="folder for the profiles")
    parser.add_argument(
        "--leak-mib", type=float, default=LEAK_MIB, help="flag a leak past this (MiB)"
    )
    args = parser.parse_args(argv)
    try:
        nvml = open_nvml()
    except GpuUnavailable as exc:
        print(f"handoff profile: {exc}", file=sys.stderr)
        return 2
    try:
        return profile_cases(nvml, args)
    except HandoffError as exc:
        print(f"handoff profile: error: {exc}", file=sys.stderr)
        return 2
    finally:
        nvml.close()


def profile_cases(nvml: Nvml, args: argparse.Namespace) -> int:
    from handoff.cases import backend_cases, only
    from handoff.plugins import configured_backend
    from handoff.runner import Settings, run_case

    backend = configured_backend(args.backend, None, Path.cwd())
    backend.check_environment()
    chosen = only(
        backend_cases(backend, None, args.selection), args.cases, backend.name, args.selection
    )
    settings = Settings(
        graceful_bound_s=float(backend.setting("graceful_bound_s")),
        startup_timeout_s=float(backend.setting("startup_timeout_s")),
        keep_logs=True,
    )
    leak_bytes = args.leak_mib * MIB
    run_dir = Path(args.logs) / time.strftime("%Y%m%d-%H%M%S")
    status = 0
    for case in chosen:
        folder = run_dir / case.topology / case.id
        sampler = Sampler(nvml).start()
        result = run_case(backend, case, folder, settings, backend.markers(case)[TIMEOUT_MARKER])
        sampler.settle(leak_bytes, Deadline(SETTLE_S))
        samples = sampler.stop()
        profiles = profile(samples)
        names = {
            e.data["pid"]: e.data["process"]
            for e in result.history.events
            if e.name == "process_launched"
        }
        marks = history_marks(result.history.events, result.history.started, samples[0].at)
        picture = plot(folder / "vram.png", samples, marks, case.key)
        rise = max((p.rise for p in profiles), default=0)
        print(f"{case.key}: {result.verdict.summary()} in {result.seconds:.1f} s")
        for line in report_lines(profiles, leak_bytes, names):
            print("  " + line)
        if sampler.error:
            print(f"  {sampler.error}")
        for line in marker_lines(case.key, vram_marker(rise), timeout_marker(result.seconds)):
            print("  " + line)
        print(f"  plot: {picture}")
        leaked = any(p.leak > leak_bytes for p in profiles)
        if leaked or not result.verdict.passed:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
