"""Port leases: unique, respected across processes, and a clear error when none is left."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

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


#: A host user's run (imports done as root: the interpreter may be root's alone): leases the
#: one port it is given, from the lease folder it is given.
LEASE_AS = """
import os, sys
from handoff.machine.ports import PortLeases
os.setgid(65534)
os.setuid(65534)
os.environ["HANDOFF_PORT_LEASES"] = sys.argv[1]
port = int(sys.argv[2])
print(PortLeases(range(port, port + 1)).take())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's lock file needs root")
def test_a_host_user_leases_a_port_whose_lock_file_root_made(monkeypatch):
    """A container run (root) and a host run (a user) share the lease folder: a lock file the
    container made, root's and not writable by others, still locks for the user."""
    shared = Path(tempfile.mkdtemp(prefix="handoff-ports-"))  # a folder the user can reach
    try:
        shared.chmod(0o777)
        monkeypatch.setenv(LEASE_DIR_ENV, str(shared))
        leases = PortLeases()
        port = leases.take()  # the lock file made by root, as in a container
        leases.release()
        (shared / f"{port}.lock").chmod(0o644)
        argv = [sys.executable, "-c", LEASE_AS, str(shared), str(port)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert (done.returncode, done.stdout.strip()) == (0, str(port)), done.stderr
    finally:
        shutil.rmtree(shared)
