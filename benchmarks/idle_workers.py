"""What an idle deployment of Dynamo's vLLM workers on vLLM's CPU build costs the machine: the
CPU share of every process tree (frontend, each worker with its EngineCore) over a quiet
window after start-up, and the threads that use it. An idle worker that keeps a core busy
slows every case beside it and, on a slow machine, the start of its pool.

Run with the vLLM CPU session's interpreter (a topology, default kv_transfer; the window in
seconds, default 10):
    .nox/vllm_cpu_pre_merge/bin/python benchmarks/idle_workers.py kv_transfer 10
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

from handoff.cases import selection
from handoff.deployment import Deployment
from handoff.machine.polling import Deadline
from handoff.plugins import configured_backend
from handoff.policies import policy

START_BOUND_S = 600.0
#: A thread is listed when it used more than this share of a core over the window.
BUSY_THREAD = 0.05


def threads_cpu(tree: list[psutil.Process]) -> dict[tuple[int, int], float]:
    """CPU seconds of every thread of `tree`, by (pid, thread id); a process that is gone
    counts nothing: the window then shows what the rest used."""
    seconds = {}
    for process in tree:
        try:
            for thread in process.threads():
                seconds[(process.pid, thread.id)] = thread.user_time + thread.system_time
        except psutil.Error:
            continue
    return seconds


def main(topology: str, window_s: float) -> None:
    backend = configured_backend("vllm", {"device": ("cpu", "benchmark")})
    case = next(iter(selection(topology, "pre_merge", backend)))
    folder = Path(tempfile.mkdtemp(prefix="handoff-idle-"))
    deployment = Deployment(backend, case, folder, policy(case.policy), backend.roles(topology))
    started = time.monotonic()
    try:
        deployment.start(Deadline(START_BOUND_S))
        print(f"{topology}: ready after {time.monotonic() - started:.1f} s ({os.cpu_count()} CPUs)")
        trees = {}
        for managed in deployment.processes:
            root = psutil.Process(managed.pid)
            trees[managed.name] = [root, *root.children(recursive=True)]
        before = {name: threads_cpu(tree) for name, tree in trees.items()}
        opened = time.monotonic()
        time.sleep(window_s)  # the quiet window measured, not a synchronisation
        elapsed = time.monotonic() - opened
        for name, tree in trees.items():
            used = {
                key: seconds - before[name].get(key, 0.0)
                for key, seconds in threads_cpu(tree).items()
            }
            print(f"  {name:18} {100 * sum(used.values()) / elapsed:6.1f} % of a core")
            for (pid, tid), seconds in sorted(used.items(), key=lambda item: -item[1]):
                if seconds / elapsed > BUSY_THREAD:
                    print(f"    thread {tid} of pid {pid}: {100 * seconds / elapsed:.1f} %")
    finally:
        deployment.stop()


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "kv_transfer",
        float(sys.argv[2]) if len(sys.argv) > 2 else 10.0,
    )
