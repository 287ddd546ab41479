"""Port leases: unique, respected across processes, and a clear error when none is left."""

import socket
import subprocess
import sys

import pytest

from handoff.errors import HandoffError
from handoff.machine.ports import LEASE_DIR_ENV, PORT_RANGE, PortLeases, bindable


@pytest.fixture(autouse=True)
def private_lease_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path))
    return tmp_path


def test_leases_are_distinct_loopback_ports_below_the_ephemeral_range():
    leases = PortLeases()
    ports = [leases.take() for _ in range(20)]
    assert len(set(ports)) == 20
    assert all(p in PORT_RANGE and p < 32768 for p in ports)
    leases.release()


def test_a_port_leased_by_another_process_is_skipped(private_lease_dir):
    first = PortLeases()
    port = first.take()
    first.release()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LEASE, str(private_lease_dir / f"{port}.lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        leases = PortLeases(range(port, port + 2))
        assert leases.take() == port + 1
        with pytest.raises(HandoffError, match=f"no free loopback port in {port}-{port + 1}"):
            leases.take()
        leases.release()
    finally:
        holder.kill()
        holder.wait()
    # The kernel drops a dead holder's lock: the port is leasable again.
    again = PortLeases(range(port, port + 1))
    assert again.take() == port
    again.release()


def test_a_port_in_use_is_never_leased():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not bindable(port)
        with pytest.raises(HandoffError, match="no free loopback port"):
            PortLeases(range(port, port + 1)).take()


HOLD_LEASE = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
signal.pause()
"""
