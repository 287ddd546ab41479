"""Every server of a deployment binds and advertises loopback only, and talks only to loopback.

One exception, from Dynamo itself: with file discovery and no NATS, Dynamo 1.6.1's ZMQ event
plane publishers bind 0.0.0.0 (the bind address is fixed in its runtime; DYN_EVENT_PLANE_HOST
sets only what they advertise, which handoff makes 127.0.0.1). On the NATS plane handoff routes
events through NATS and none are opened. See docs/known-issues.md.
"""

import json
import tempfile
from pathlib import Path

import pytest

from handoff.cases import Case
from handoff.deployment import Deployment
from handoff.machine.polling import Deadline, poll_until
from handoff.policies import policy
from handoff_mocker import MockerBackend

LOOPBACK = {"127.0.0.1", "::1"}
DEPLOYMENTS = [
    ("aggregate", "migration_enabled-worker_failure-chat-stream-nats"),
    ("aggregate", "migration_enabled-worker_failure-chat-stream-tcp"),
    ("decode", "migration_enabled-worker_failure-chat-stream-tcp"),
    ("prefill", "migration_enabled-worker_failure-chat-stream-nats"),
]


def sockets(deployment):
    """(process name, status, local ip, local port, remote ip) of every inet socket."""
    found = []
    for process in deployment.processes:
        for proc in process.tree():
            for c in proc.net_connections(kind="inet"):
                remote = c.raddr.ip if c.raddr else None
                found.append((process.name, c.status, c.laddr.ip, c.laddr.port, remote))
    return found


def event_channels(discovery: Path) -> list[dict]:
    """The event channels registered so far. Dynamo writes each entry to a hidden temporary
    file and renames it into place: those are skipped, and one renamed away meanwhile too."""
    channels = []
    for path in (discovery / "v1" / "event_channels").glob("[!.]*"):
        try:
            channels.append(json.loads(path.read_text()))
        except FileNotFoundError:
            continue
    return channels


def zmq_ports(channels: list[dict]) -> set[int]:
    """Ports of the ZMQ event publishers the workers advertise; advertised on loopback."""
    ports = set()
    for channel in channels:
        if channel["transport"]["kind"] == "Zmq":
            endpoint = channel["transport"]["config"]["endpoint"]
            assert endpoint.startswith("tcp://127.0.0.1:"), endpoint
            ports.add(int(endpoint.rsplit(":", 1)[1]))
    return ports


@pytest.mark.parametrize(("topology", "case_id"), DEPLOYMENTS)
def test_servers_bind_and_talk_loopback_only(topology, case_id):
    case = Case.from_id(case_id, topology)
    backend = MockerBackend()
    folder = Path(tempfile.mkdtemp(prefix="handoff-loopback-"))
    deployment = Deployment(backend, case, folder, policy(case.policy), backend.roles(topology))
    try:
        deployment.start(Deadline(60))

        # Event channels register after the workers are routable; each worker has at least
        # three (kv_metrics, forward-pass-metrics, and kv-events or active_sequences_events).
        def registered():
            channels = event_channels(folder / "discovery")
            wide = {s[3] for s in sockets(deployment) if s[1] == "LISTEN" and s[2] not in LOOPBACK}
            advertised = zmq_ports(channels)
            # A publisher binds a moment before it registers: wait until every wide listener
            # is an advertised publisher. One that never is fails the test at the deadline.
            done = len(channels) >= 3 * len(deployment.workers) and wide == advertised
            seen = f"{len(channels)} channels, wide {sorted(wide)}, advertised {sorted(advertised)}"
            return ((wide, advertised) if done else None), seen

        wide, advertised = poll_until(
            registered, Deadline(10), "every non-loopback listener to be an advertised publisher"
        )
        if case.plane == "nats":
            assert wide == set(), "NATS-plane events go through NATS: no ZMQ publisher"
        else:
            assert advertised, "the TCP plane's events go through ZMQ publishers"
        seen = sockets(deployment)
        listening = [s for s in seen if s[1] == "LISTEN"]
        assert {s[0] for s in listening if s[2] not in LOOPBACK} <= {
            p.name for p in deployment.processes if p.name.startswith("worker-")
        }
        talking = [s for s in seen if s[4] is not None]
        assert talking and all(s[4] in LOOPBACK for s in talking), talking
    finally:
        assert deployment.stop() == []
