"""etcd, Dynamo's production discovery, started by handoff on loopback for one pool: one member
or three, each a process of the pool with its own ports and data folder, and read or written
through etcd's v3 JSON gateway.

Dynamo 1.6.1 on etcd (measured, docs/known-issues.md): a worker's instance id is its primary
lease's id, so revoking that lease removes every key it wrote; each key is
`v1/<kind>/<namespace>/<component>/<endpoint>/.../<instance hex>`, as in the file store; a
process whose lease keep-alive fails shuts itself down once its lease has run out.

A member's data folder is an owned folder (`ownership.own_folder`): removed when the member is
stopped for good, and by the next run when the run that made it was killed.
"""

from __future__ import annotations

import base64
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import requests

from handoff.errors import CaseFailure
from handoff.machine import ownership
from handoff.machine.environment import require_binary
from handoff.machine.polling import Deadline, poll_until
from handoff.machine.processes import ManagedProcess
from handoff.machine.services import LOOPBACK

#: Dynamo's primary lease, in seconds (its ETCD_LEASE_TTL; Dynamo's default is 30): the file
#: store's lease, so that a case's bounds hold on either discovery.
LEASE_TTL_S = 10
#: How long one gateway call may take before its answer counts as none.
CALL_TIMEOUT_S = 2.0
READY_TIMEOUT_S = 30.0
FIX = "apt-get install etcd-server (as root), or run on --handoff-discovery file"


def missing() -> str | None:
    """Why etcd cannot run here, in one line that says the fix; None when it can."""
    return None if shutil.which("etcd") else f"etcd is not installed: {FIX}"


class Unanswered(Exception):
    """The gateway did not answer: what it holds is unknown, never empty."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    """The first key after every key that starts with `prefix` (etcd's range_end)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    process: ManagedProcess | None = None
    data: Path | None = None

    @property
    def client_url(self) -> str:
        return f"http://{LOOPBACK}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{LOOPBACK}:{self.peer_port}"


class Cluster:
    """The members of one pool's etcd; `spawn` starts a named process the pool owns."""

    def __init__(
        self,
        members: list[Member],
        spawn: Callable[[str, list[str]], ManagedProcess],
        lease_s: int = LEASE_TTL_S,
    ) -> None:
        self.members = members
        self._spawn = spawn
        self.lease_s = lease_s
        #: The longest its members took from their start to a healthy cluster, measured at
        #: each start: how soon a restart can be back (`discovery_plane.OUTAGE_MARGIN_S`).
        self.slowest_start_s = 0.0
        self._started_at = 0.0

    @property
    def endpoints(self) -> str:
        """ETCD_ENDPOINTS: every member's client URL."""
        return ",".join(m.client_url for m in self.members)

    def env(self) -> dict[str, str]:
        return {"ETCD_ENDPOINTS": self.endpoints, "ETCD_LEASE_TTL": str(self.lease_s)}

    def start(self) -> None:
        for member in self.members:
            self.start_member(member, state="new")

    def start_member(self, member: Member, state: str = "existing") -> None:
        """Start `member` on its ports and data folder: anew, or again after it was killed
        (`state` "existing": it rejoins the cluster it was in with what its folder holds)."""
        if member.data is None:
            member.data = ownership.own_folder(f"etcd-{member.client_port}")
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        argv = [
            require_binary("etcd", FIX),
            "--name", member.name,
            "--data-dir", str(member.data),
            "--listen-client-urls", member.client_url,
            "--advertise-client-urls", member.client_url,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", cluster,
            "--initial-cluster-state", state,
        ]  # fmt: skip
        member.process = self._spawn(member.name, argv)
        self._started_at = time.monotonic()

    def wait_ready(self, deadline: Deadline) -> None:
        """Until every member says it is healthy (it has a leader); a member that exited fails
        at once, naming its log."""

        def probe() -> tuple[bool | None, str]:
            for member in self.members:
                if (process := member.process) is None or process.exit_code() is not None:
                    tail = f"log {process.log_path}:\n{process.log_tail()}" if process else ""
                    raise CaseFailure(f"etcd member {member.name} is not running; {tail}")
            sick = [m.name for m in self.members if not _healthy(m)]
            return (None if sick else True), f"not healthy yet: {', '.join(sick)}"

        poll_until(probe, deadline.within(READY_TIMEOUT_S), "etcd to have a leader")
        self.slowest_start_s = max(self.slowest_start_s, time.monotonic() - self._started_at)

    def restart(self, members: list[Member], deadline: Deadline) -> None:
        """Start `members` again on their data, and wait until every member is healthy."""
        for member in members:
            self.start_member(member)
        self.wait_ready(deadline)

    def alive(self, member: Member) -> bool:
        return member.process is not None and member.process.exit_code() is None

    def call(self, member: Member | None, path: str, body: dict) -> dict:
        """One gateway call to `member`, or to the live members last first (in a pinned layout
        the frontend's, which no fault cuts: handoff's own calls never count as a cut worker's
        packets); Unanswered when none answers."""
        targets = [member] if member else [m for m in reversed(self.members) if self.alive(m)]
        for target in targets:
            try:
                answer = requests.post(target.client_url + path, json=body, timeout=CALL_TIMEOUT_S)
                answer.raise_for_status()
                return answer.json()
            except (requests.RequestException, ValueError):
                continue
        raise Unanswered(f"no etcd member answered {path}")

    def entries(self, prefix: str) -> dict[str, tuple[bytes, int]]:
        """Every key under `prefix`: its value and the lease it is attached to (0: none)."""
        asked = {"key": _b64(prefix), "range_end": _prefix_end(prefix)}
        found = self.call(None, "/v3/kv/range", asked)
        return {
            base64.b64decode(kv["key"]).decode(): (
                base64.b64decode(kv.get("value", "")),
                int(kv.get("lease", 0)),
            )
            for kv in found.get("kvs", [])
        }

    def revoke(self, lease: int) -> bool:
        """Revoke `lease` and with it every key attached to it; False when it had ended."""
        try:
            self.call(None, "/v3/lease/revoke", {"ID": lease})
        except Unanswered:
            if self.time_to_live(lease) is None:
                return False
            raise
        return True

    def time_to_live(self, lease: int) -> int | None:
        """The seconds `lease` has left; None once it has ended (etcd says -1; the gateway
        leaves out a field that is 0)."""
        ttl = int(self.call(None, "/v3/lease/timetolive", {"ID": lease}).get("TTL", 0))
        return None if ttl < 0 else ttl

    def leases(self) -> set[int]:
        """Every lease etcd holds now, by id."""
        return {
            int(lease["ID"]) for lease in self.call(None, "/v3/lease/leases", {}).get("leases", [])
        }

    def shortest_lease(self) -> int:
        """The seconds the lease nearest its end has left, of every lease etcd holds."""
        leases = self.call(None, "/v3/lease/leases", {}).get("leases", [])
        left = [t for lease in leases if (t := self.time_to_live(int(lease["ID"]))) is not None]
        if not left:
            raise Unanswered("etcd holds no lease: no process of the deployment registered")
        return min(left)

    def remove_data(self) -> list[str]:
        """Remove every member's data folder, once every member is gone for good; a problem
        for each that stays (its record too, so that the next run tries again)."""
        problems = []
        for member in self.members:
            if member.data is not None and not ownership.drop_folder(member.data):
                problems.append(f"etcd data folder {member.data} could not be removed")
            member.data = None
        return problems


def _healthy(member: Member) -> bool:
    try:
        answer = requests.get(member.client_url + "/health", timeout=CALL_TIMEOUT_S)
        return answer.ok and answer.json().get("health") == "true"
    except (requests.RequestException, ValueError):
        return False


def members(take_port: Callable[[], int], count: int) -> list[Member]:
    """`count` members, each on two ports taken from `take_port`."""
    return [Member(f"etcd-{i}", take_port(), take_port()) for i in range(1, count + 1)]
