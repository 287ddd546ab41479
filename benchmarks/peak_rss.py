"""Run a command and print its wall time, the CPU time of everything it started (and reaped),
and the peak resident memory of its whole process tree (sampled every 0.1 s), e.g. a nox
session with its pytest, workers and deployments.

    python benchmarks/peak_rss.py -- nox -s vllm_cpu_pre_merge
"""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
import time

import psutil
from selection_run import SAMPLE_S, _tree_rss


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = subprocess.Popen(command)
    root, peak = psutil.Process(process.pid), 0
    while process.poll() is None:
        peak = max(peak, _tree_rss(root))
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=SAMPLE_S)  # the sampling period, not a synchronisation
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(
        f"peak_rss: exit {process.returncode}, wall {time.monotonic() - started:.1f} s, "
        f"CPU {cpu:.1f} s, peak RSS of the tree {peak / 2**20:.0f} MiB"
    )
    return process.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
