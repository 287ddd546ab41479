"""A test's leftover processes are killed when it fails for them, so that the next test on the
same xdist worker is not blamed for what it did not start."""

import subprocess
import sys

import psutil
import pytest
from leaks import ports_held, reap, running

from handoff.machine.ownership import MARK_ENV
from handoff.machine.polling import Deadline, poll_until
from handoff.machine.ports import PortLeases, bindable

LISTEN = "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])));"
LISTEN += " s.listen(); print('up', flush=True); time.sleep(600)"


def test_reap_kills_every_leftover_and_waits_until_it_is_gone():
    started = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)
    ]
    left = [psutil.Process(p.pid) for p in started]
    reap(left)
    assert running(left) == []
    assert not any(p.is_running() for p in left)


@pytest.mark.parametrize(("listener_mark", "held"), [("this-test", True), ("another-test", False)])
def test_a_port_is_held_only_by_a_listener_that_carries_the_tests_mark(
    monkeypatch, listener_mark, held
):
    """Another test may lease and bind a port once this test's case let it go: its listener is
    not this test's leftover; one carrying this test's mark is."""
    monkeypatch.setenv(MARK_ENV, "this-test")
    leases = PortLeases()
    port = leases.take()
    leases.release()
    env = {"PATH": "/usr/bin:/bin", MARK_ENV: listener_mark}
    server = subprocess.Popen(
        [sys.executable, "-c", LISTEN, str(port)], env=env, stdout=subprocess.PIPE
    )
    try:
        assert server.stdout.readline() == b"up\n"
        assert not bindable(port)
        assert (port in ports_held([port])) is held
    finally:
        reap([psutil.Process(server.pid)])
    poll_until(lambda: (bindable(port) or None, "bound"), Deadline(10), f"port {port} free")
    assert ports_held([port]) == {}
