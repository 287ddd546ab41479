"""VRAM scheduling and NVML profiling on a real GPU, with synthetic cases: child processes that
allocate known sizes with torch and hold them for a while.

    PYTHONPATH=packages/core/src python benchmarks/gpu_scheduling.py [--budget-gib 40] [--slots 4]
        [--out DIR]
    PYTHONPATH=packages/core/src python benchmarks/gpu_scheduling.py --simulate   # CPU rehearsal

It needs only the standard library, pynvml and torch (in the children); `--simulate` replaces
NVML and torch with a file-backed stand-in, to rehearse the script's own logic on a CPU
machine: nothing it prints then is a measurement.

1. The GPU, its idle use, and the CUDA context: the NVML per-process use of a tiny process
   (torch.zeros(1) on the GPU, the same script as every case with nothing allocated).
2. Alone: each case on its own under `profiling.Sampler` (100 ms): its process's NVML peak
   minus the context against what it allocated (within 5 %), the device's rise, the wall time,
   and the markers `profiling` derives from them (profiled VRAM = peak rounded up, timeout =
   3 x wall).
3. The plan (`placement.plan`, what `--handoff-dry-run` prints) for those markers under the
   budget; a 60 GiB case is refused.
4. Together: `--slots` worker processes (as pytest-xdist workers are) take the cases longest
   first; each takes a reservation from `vram_ledger.GpuLedger` (a real flock file), runs the
   case's process with `CUDA_VISIBLE_DEVICES` of the GPU it was given, and releases. The
   sampler runs throughout: the largest (device used - idle baseline) of every 100 ms sample
   against the budget; every process's peak against its allocation again; makespan against
   the cases one by one.
5. A leak: a case whose process starts a detached child that keeps 2 GiB after the case ended;
   the profile flags it; the child is then killed (by its pid) and the GPU settles back.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from handoff.commands.profiling import (
    Sampler,
    plot,
    profile,
    report_lines,
    timeout_marker,
    vram_marker,
)
from handoff.machine.polling import Deadline
from handoff.sharing.nvml import GIB, MIB, Device, ProcessUse, cuda_env, open_nvml
from handoff.sharing.placement import Demand, plan, plan_lines
from handoff.sharing.vram_ledger import GpuLedger, start_time

#: name, GiB allocated, seconds held after allocating.
CASES = [
    ("alloc-24g", 24, 8), ("alloc-16g", 16, 8), ("alloc-12g", 12, 6), ("alloc-10g", 10, 6),
    ("alloc-8g", 8, 5), ("alloc-6g", 6, 5), ("alloc-4g", 4, 4), ("alloc-2g", 2, 4),
    ("cpu-only", 0, 3),
]  # fmt: skip
#: Not run: its marker (a larger deployment's profile) is over the budget.
OVERSIZE = ("alloc-60g", 60.7, 8)
LEAK_PARENT_GIB, LEAK_CHILD_GIB = 1, 2
LEAK_MIB = 128
TOLERANCE = 0.05

#: A case's process. argv: mode (cpu: no GPU at all; gpu: the CUDA context and GiB; leak: the
#: same, plus a detached child left holding LEAK_CHILD_GIB), GiB, seconds to hold, then for
#: leak this script and the child's GiB. With HANDOFF_SIM set, a file stands in for torch.
CHILD = r"""
import os, subprocess, sys, time
mode, gib, hold = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
sim = os.environ.get("HANDOFF_SIM")
if mode != "cpu":
    if sim:
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0")
        time.sleep(0.5)  # "importing torch"
        with open(os.path.join(sim, str(os.getpid())), "w") as f:
            f.write(f"{gpu} {int(600 * 2**20 + 2 * 2**20 + gib * 2**30)}")
    else:
        import torch
        torch.zeros(1, device="cuda")  # the CUDA context (and one 2 MiB block)
        block = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda") if gib else None
        torch.cuda.synchronize()
if mode == "leak":
    left = subprocess.Popen(
        [sys.executable, "-c", sys.argv[4], "gpu", sys.argv[5], "300"],
        stdout=subprocess.PIPE, start_new_session=True,
    )
    print(left.pid, flush=True)
    left.stdout.readline()  # it has allocated
print("allocated", flush=True)
time.sleep(hold)
"""


class FileNvml:
    """`--simulate`: one 140 GiB GPU whose use is what live children wrote in a folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _uses(self) -> list[ProcessUse]:
        uses = []
        for path in self.folder.iterdir():
            if path.name.isdigit() and start_time(int(path.name)) is not None:
                try:
                    gpu, used = path.read_text().split()
                except ValueError:
                    continue
                uses.append(ProcessUse(int(path.name), int(gpu), int(used)))
        return uses

    def devices(self) -> list[Device]:
        used = 615 * MIB + sum(u.used for u in self._uses())
        return [Device(0, "GPU-simulated", "simulated", 140 * GIB, used)]

    def processes(self, index: int) -> list[ProcessUse] | None:
        return [u for u in self._uses() if u.device == index]

    def close(self) -> None:
        pass


def nvml_for(simulate: str | None):
    return FileNvml(Path(simulate)) if simulate else open_nvml()


def child_argv(gib: float, hold: float, mode: str = "gpu") -> list[str]:
    argv = [sys.executable, "-c", CHILD, mode, str(gib), str(hold)]
    return argv + ([CHILD, str(LEAK_CHILD_GIB)] if mode == "leak" else [])


def run_alone(nvml, gpu: int, gib: float, hold: float, mode: str = "gpu") -> dict:
    """One case on its own, sampled from before it starts until its GPU settles back."""
    sampler = Sampler(nvml).start()
    started = time.monotonic()
    env = {**os.environ, **cuda_env(gpu)}
    child = subprocess.Popen(
        child_argv(gib, hold, mode), env=env, stdout=subprocess.PIPE, text=True
    )
    left = int(child.stdout.readline()) if mode == "leak" else None
    child.communicate()
    ended = time.monotonic()
    settled = sampler.settle(LEAK_MIB * MIB, Deadline(5))
    samples = sampler.stop()
    return {
        "pid": child.pid,
        "left": left,
        "wall": ended - started,
        "ended": ended,
        "settled": settled,
        "samples": samples,
        "rc": child.returncode,
    }


def slot_worker(slot, todo, done, folder, budget, simulate) -> None:
    """One CPU slot, as a pytest-xdist worker: next case, reservation, process, release."""
    if simulate:
        os.environ["HANDOFF_SIM"] = simulate
    ledger = GpuLedger(nvml_for(simulate), budget, Path(folder))
    while (item := todo.get()) is not None:
        name, gib, hold, marker, timeout = item
        asked = time.monotonic()
        reservation, env = None, dict(os.environ)
        if marker > 0:
            reservation = ledger.take(Demand(name, marker, timeout), Deadline(600))
            env.update(cuda_env(reservation.gpu))
        started = time.monotonic()
        mode = "gpu" if gib else "cpu"
        child = subprocess.Popen(child_argv(gib, hold, mode), env=env, stdout=subprocess.DEVNULL)
        child.wait()
        ended = time.monotonic()
        if reservation is not None:
            ledger.release(reservation)
        done.put(
            {
                "name": name, "slot": slot, "pid": child.pid, "rc": child.returncode,
                "gpu": None if reservation is None else reservation.gpu, "gib": gib,
                "marker": marker, "asked": asked, "started": started, "ended": ended,
            }
        )  # fmt: skip


def mib(nbytes: float) -> str:
    return f"{nbytes / MIB:,.0f} MiB"


def per_process_peak(samples, gpu: int, pid: int) -> int | None:
    peaks = [s.processes[gpu][pid] for s in samples if pid in s.processes.get(gpu, {})]
    return max(peaks) if peaks else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-gib", type=float, default=40.0)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("gpu-scheduling-out"))
    parser.add_argument("--simulate", action="store_true", help="CPU rehearsal, no GPU")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    simulate = tempfile.mkdtemp(prefix="handoff-sim-") if args.simulate else None
    if simulate:
        os.environ["HANDOFF_SIM"] = simulate
    nvml = nvml_for(simulate)
    device = nvml.devices()[0]
    gpu = device.index
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, Python {platform.python_version()}"
    )
    print(
        f"GPU {gpu}: {device.name}, {mib(device.total)} total, {mib(device.used)} used at idle"
        + ("  [SIMULATED: nothing below is a measurement]" if simulate else "")
    )
    context, attributed = context_of(nvml, gpu)
    alone = each_alone(nvml, gpu, context, attributed)
    serial_s = sum(a["wall"] for a in alone.values())
    folder = tempfile.mkdtemp(prefix="handoff-ledger-")
    ledger = GpuLedger(nvml, args.budget_gib, Path(folder))
    demands = [Demand(n, a["marker"], a["timeout"]) for n, a in alone.items()]
    demands.append(Demand(OVERSIZE[0], OVERSIZE[1], timeout_marker(OVERSIZE[2] + 4)))
    print(f"\n## The plan (--handoff-dry-run) under --max-vram-gib {args.budget_gib:g}")
    for line in plan_lines(plan(demands, ledger.rooms(), args.slots)):
        print(line)
    measured = Measured(nvml, gpu, context, attributed)
    makespan, over = together(measured, args, alone, demands, folder, simulate)
    print(
        f"makespan together {makespan:.1f} s; one by one {serial_s:.1f} s "
        f"(x{serial_s / makespan:.2f})"
    )
    leaked(nvml, gpu, args.out)
    (args.out / "summary.json").write_text(
        json.dumps({"makespan_s": makespan, "serial_s": serial_s, "max_over_gib": max(over)})
    )
    nvml.close()
    for made in (folder, simulate):
        if made:
            shutil.rmtree(made, ignore_errors=True)
    return 0


@dataclass(frozen=True)
class Measured:
    """What the processes' peaks are read against: the GPU, and the CUDA context of one
    process (attributed per process where NVML says so, else the device's rise)."""

    nvml: object
    gpu: int
    context: int
    attributed: bool


def context_of(nvml, gpu: int) -> tuple[int, bool]:
    """The CUDA context of a tiny process, and whether NVML attributes use per process."""
    tiny = run_alone(nvml, gpu, 0, 1)
    context = per_process_peak(tiny["samples"], gpu, tiny["pid"])
    tiny_rise = profile(tiny["samples"])[0].rise
    attributed = context is not None
    if not attributed:
        print("NVML gives no per-process use here: comparing device rises instead")
        context = tiny_rise
    print(
        f"CUDA context of a tiny process (torch.zeros(1)): {mib(context)} per process, "
        f"device rise {mib(tiny_rise)}"
    )
    return context, attributed


def each_alone(nvml, gpu: int, context: int, attributed: bool) -> dict[str, dict]:
    """Each case run alone: its peak against its allocation, and its markers."""
    print("\n## Each case alone (100 ms NVML samples)")
    print(
        f"{'case':<10} {'alloc':>8} {'proc peak':>10} {'- context':>10} {'error':>7} "
        f"{'dev rise':>10} {'wall s':>7} {'markers':>26}"
    )
    alone, within = {}, True
    for name, gib, hold in CASES:
        run = run_alone(nvml, gpu, gib, hold, "gpu" if gib else "cpu")
        prof = profile(run["samples"])[0]
        peak = per_process_peak(run["samples"], gpu, run["pid"]) if attributed else prof.rise
        measured = (peak or 0) - context if gib else 0
        error = abs(measured - gib * GIB) / (gib * GIB) if gib else 0.0
        within &= error <= TOLERANCE
        marker = vram_marker(prof.rise) if gib else 0.0
        timeout = timeout_marker(run["wall"])
        alone[name] = {"gib": gib, "hold": hold, "marker": marker, "timeout": timeout, **run}
        print(
            f"{name:<10} {mib(gib * GIB):>8} {mib(peak or 0):>10} {mib(measured):>10} "
            f"{error:>6.2%} {mib(prof.rise):>10} {run['wall']:>7.1f} "
            f"{f'vram({marker:g}) timeout({timeout:g})':>26}"
        )
    print(f"every process's peak minus the context within 5 % of its allocation: {within}")
    return alone


def together(
    measured: Measured, args, alone: dict, demands: list, folder: str, simulate: str | None
) -> tuple[float, list[float]]:
    """Every case at once on `args.slots` slot processes under the ledger: the makespan and
    the device's use above its idle baseline, sample by sample."""
    print(f"\n## Together: {args.slots} slot processes, the ledger, budget {args.budget_gib:g} GiB")
    context_mp = multiprocessing.get_context("spawn")
    todo, done = context_mp.Queue(), context_mp.Queue()
    for d in sorted(demands, key=lambda d: -d.timeout_s):
        if d.key == OVERSIZE[0]:
            print(f"not run: {d.key}: profiled_vram_gib({d.vram_gib:g}) > {args.budget_gib:g}")
            continue
        a = alone[d.key]
        todo.put((d.key, a["gib"], a["hold"], d.vram_gib, d.timeout_s))
    for _ in range(args.slots):
        todo.put(None)
    sampler = Sampler(measured.nvml).start()
    began = time.monotonic()
    workers = [
        context_mp.Process(
            target=slot_worker, args=(n + 1, todo, done, folder, args.budget_gib, simulate)
        )
        for n in range(args.slots)
    ]
    for w in workers:
        w.start()
    results = []
    while len(results) < len(alone):
        try:
            results.append(done.get(timeout=600))
        except queue.Empty:
            break
    for w in workers:
        w.join()
    samples = sampler.stop()
    over = [(s.used[measured.gpu] - samples[0].used[measured.gpu]) / GIB for s in samples]
    together_table(measured, results, samples, began, over, args.budget_gib)
    marks = [(r["started"] - samples[0].at, r["name"].removeprefix("alloc-")) for r in results]
    plot(args.out / "together.png", samples, marks, "together", args.budget_gib)
    print(f"exit codes {sorted({r['rc'] for r in results})}")
    return max(r["ended"] for r in results) - began, over


def together_table(
    measured: Measured, results: list, samples: list, began: float, over: list, budget: float
) -> None:
    """Each case's slot, marker, start, wait and peak, then the device's use over the run."""
    gpu, context = measured.gpu, measured.context
    print(f"{'case':<10} {'slot':>4} {'GPU':>3} {'marker':>6} {'start s':>7} {'end s':>6} "
          f"{'waited s':>8} {'proc peak - ctx':>15} {'error':>7}")  # fmt: skip
    all_within = True
    for r in sorted(results, key=lambda r: r["started"]):
        peak = per_process_peak(samples, gpu, r["pid"]) if r["gib"] else None
        used = (peak - context) if peak is not None else None
        error = abs(used - r["gib"] * GIB) / (r["gib"] * GIB) if used is not None else 0
        if r["gib"] and measured.attributed:
            all_within &= error <= TOLERANCE
        shown = "-" if used is None else mib(used)
        print(
            f"{r['name']:<10} {r['slot']:>4} {r['gpu'] if r['gpu'] is not None else '-':>3} "
            f"{r['marker']:>6.1f} {r['started'] - began:>7.1f} {r['ended'] - began:>6.1f} "
            f"{r['started'] - r['asked']:>8.1f} {shown:>15} {error:>6.2%}"
        )
    held = max(
        sum(
            o["marker"]
            for o in results
            if o["gpu"] == gpu and o["started"] <= r["started"] < o["ended"]
        )
        for r in results
    )
    print(
        f"{len(samples)} samples over {samples[-1].at - samples[0].at:.1f} s; largest use above "
        f"the idle baseline {max(over):.2f} GiB (budget {budget:g}); samples over the "
        f"budget: {sum(v > budget for v in over)}; largest sum of markers running at "
        f"once {held:.1f} GiB"
    )
    print(
        f"every process's peak minus the context within 5 %: {all_within and measured.attributed}"
    )


def leaked(nvml, gpu: int, out: Path) -> None:
    """A case's process that leaves a detached child holding 2 GiB: flagged, and the device
    back at its baseline once the child is killed."""
    print("\n## A leak: the case's process leaves a detached child holding 2 GiB")
    leak = run_alone(nvml, gpu, LEAK_PARENT_GIB, 1, "leak")
    profiles = profile(leak["samples"])
    for line in report_lines(
        profiles, LEAK_MIB * MIB, {leak["pid"]: "case", leak["left"]: "left behind"}
    ):
        print(line)
    print(f"leak flagged: {any(p.leak > LEAK_MIB * MIB for p in profiles)}")
    ended_at = leak["ended"] - leak["samples"][0].at
    plot(out / "leak.png", leak["samples"], [(ended_at, "DONE")], "leak")
    os.kill(leak["left"], signal.SIGKILL)  # the child this benchmark's case left behind
    after = Sampler(nvml).start()
    back = after.settle(LEAK_MIB * MIB, Deadline(10))
    after.stop()
    print(f"after killing pid {leak['left']}: back at the baseline: {back}")


if __name__ == "__main__":
    sys.exit(main())
