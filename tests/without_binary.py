"""A qualification run on a machine without a binary its cases need (nft, etcd): the binary is
hidden from PATH, and the run's output says what was not run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def run_without(binary: str, cases: list[str], logs: Path) -> subprocess.CompletedProcess[str]:
    """The mocker's `cases` (`topology/id`) run with `binary` on no folder of PATH."""
    hidden = os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not shutil.which(binary, path=d)
    )
    assert shutil.which(binary, path=hidden) is None
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "handoff.qualification",
         "-p", "no:cacheprovider", "--handoff-backend", "mocker", "--handoff-logs", str(logs),
         *(arg for case in cases for arg in ("--handoff-case", case))],
        env={**os.environ, "PATH": hidden}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def not_run(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines of the run's output that say what was not run."""
    return [line for line in done.stdout.splitlines() if "not run" in line]
