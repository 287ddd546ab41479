"""Free loopback ports, leased so that concurrent runs and pytest workers never share one.

A lease is an exclusive flock on a per-port file in a shared folder: the kernel drops it when
the holder exits, even by SIGKILL, so a crashed run never leaves a port reserved. The folder is
one of the machine's shared ones (handoff.machine.shared): a container run sees the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

import psutil

from handoff.errors import HandoffError

#: Dynamo reads DYN_SYSTEM_PORT as a signed 16-bit integer, and the kernel hands out ephemeral
#: ports from 32768 up: stay between the well-known ports and the ephemeral range.
PORT_RANGE = range(20000, 32768)
LEASE_DIR_ENV = "HANDOFF_PORT_LEASES"
#: `FIRST-LAST` (inclusive): the ports handoff may lease, inside PORT_RANGE.
RANGE_ENV = "HANDOFF_PORT_RANGE"


def port_range() -> range:
    """PORT_RANGE, or the part of it that HANDOFF_PORT_RANGE names."""
    text = os.environ.get(RANGE_ENV)
    if not text:
        return PORT_RANGE
    try:
        first, last = (int(part) for part in text.split("-"))
    except ValueError:
        first = last = -1
    if not (PORT_RANGE.start <= first <= last < PORT_RANGE.stop):
        raise HandoffError(
            f"{RANGE_ENV}={text!r} is not FIRST-LAST within "
            f"{PORT_RANGE.start}-{PORT_RANGE.stop - 1}: e.g. {RANGE_ENV}=24000-24999"
        )
    return range(first, last + 1)


def lease_path() -> Path:
    """Where the leases are (and the VRAM ledger beside them): HANDOFF_PORT_LEASES, else
    handoff-ports in the temporary folder. Not made here: `lease_dir` makes it."""
    return Path(os.environ.get(LEASE_DIR_ENV) or Path(tempfile.gettempdir(), "handoff-ports"))


def lease_dir() -> Path:
    folder = lease_path()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def try_lock(path: Path) -> int | None:
    """An exclusive flock on `path` (made if missing), held by the descriptor returned until it
    is closed, or its process ends; None where another holds it. Read-only is enough to lock,
    and opens a lock file that root made (a container run shares the folder) for a host user
    too."""
    fd = os.open(path, os.O_CREAT | os.O_RDONLY, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def bindable(port: int) -> bool:
    """True when a server could listen on 127.0.0.1:port right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listener(port: int) -> str:
    """Who listens on `port` of loopback, for an error message: its pid and command line."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            if conn.pid is None:
                return "a process this user cannot see"
            with contextlib.suppress(psutil.Error):
                command = " ".join(psutil.Process(conn.pid).cmdline())
                return f"pid {conn.pid} ({command[:160]})"
            return f"pid {conn.pid}"
    return "no listener (the port is in another state, e.g. TIME_WAIT)"


class PortLeases:
    """Ports held by one deployment until `release()`."""

    def __init__(self, ports: range | None = None) -> None:
        self.port_range = ports or port_range()
        self._held: dict[int, int] = {}  # port -> lock file descriptor

    @property
    def ports(self) -> list[int]:
        return list(self._held)

    def take(self) -> int:
        """Lease one port that no other lease holds and that is free to bind."""
        folder = lease_dir()
        start = random.randrange(len(self.port_range))
        for i in range(len(self.port_range)):
            port = self.port_range[(start + i) % len(self.port_range)]
            if port in self._held:
                continue
            if (fd := try_lock(folder / f"{port}.lock")) is None:
                continue
            if bindable(port):
                self._held[port] = fd
                return port
            os.close(fd)
        raise HandoffError(
            f"no free loopback port in {self.port_range.start}-{self.port_range.stop - 1}: "
            f"stop what holds them, or widen {RANGE_ENV}, then run again"
        )

    def release(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()
