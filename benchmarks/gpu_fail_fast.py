"""How fast a GPU backend's run gives up on a machine that cannot run it (no GPU, no engine,
no docker engine): the seconds from `handoff qualify` to its one-line error, per backend.

    python benchmarks/gpu_fail_fast.py [--runs 5]

Run it in the environment a GPU nox session builds (handoff core and the GPU backend packages
installed); the target is under 10 s after install.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time

BACKENDS = ("vllm", "sglang", "trtllm")


def attempt(backend: str, image: str | None) -> tuple[float, int, str]:
    argv = [sys.executable, "-m", "handoff.cli", "qualify", "--backend", backend]
    argv += ["--image", image] if image else ["-p", "no:cacheprovider"]
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - started
    out = result.stdout + result.stderr
    reason = next((line for line in out.splitlines() if "cannot run" in line), "(no reason line)")
    return seconds, result.returncode, reason


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{platform.node()}, Python {platform.python_version()}, {args.runs} runs each")
    for image in (None, "team/runtime:1"):
        where = "in an image" if image else "on this host"
        for backend in BACKENDS:
            runs = [attempt(backend, image) for _ in range(args.runs)]
            times = [r[0] for r in runs]
            codes = sorted({r[1] for r in runs})
            print(
                f"{backend:<7} {where:<13} median {statistics.median(times):5.2f} s, "
                f"max {max(times):5.2f} s, exit {codes}: {runs[0][2][:110]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
