"""Where a pool's Dynamo processes find each other: Dynamo's file store (a folder) or etcd,
the discovery production runs. Each says what its processes' environment needs, which
instance ids a worker registered, and how a dead worker's registrations are removed at once
(a SIGKILLed worker's stay until its lease runs out, and every frontend lists it until then).

The file store lets a spare wait unseen in a folder of its own (`registrations.Mirror`); etcd
has no such room, so a pool on etcd keeps no spares: a faulted worker's successor starts once
its case has ended.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from handoff.machine import etcd, registrations


@dataclass(frozen=True)
class Layout:
    """Which discovery a pool's processes register in: the file store, or etcd of `members`
    members; `pinned`: each Dynamo process is given one member of its own (the frontend the
    last), so that a worker cut off from its member is cut off from etcd, and nothing else is."""

    kind: str = "file"
    members: int = 0
    pinned: bool = False
    #: The lease etcd's processes are given (`ETCD_LEASE_TTL`).
    lease_s: int = etcd.LEASE_TTL_S

    @property
    def keeps_spares_unseen(self) -> bool:
        """Whether a worker can register where no frontend sees it until it is handed over: in
        a folder of its own, on the file store only."""
        return self.kind == "file"

    @property
    def label(self) -> str:
        if self.kind == "file":
            return ""
        lease = f"-lease{self.lease_s}" if self.lease_s != etcd.LEASE_TTL_S else ""
        return f"{self.kind}{self.members}{'-pinned' if self.pinned else ''}{lease}"


FILE = Layout()
#: The registration kinds whose keys end with the instance hex.
CARDS, ENDPOINTS = "v1/mdc/", "v1/instances/"


class Discovery(Protocol):
    kind: str

    def env(self) -> dict[str, str]: ...

    def instance_ids(self, system_port: int) -> set[int]:
        """Empty until the worker on `system_port` has registered; `etcd.Unanswered` when the
        store cannot be read."""

    def remove(self, ids: set[int]) -> list[str]:
        """Remove the registrations of instances `ids`; what was removed."""


class FileDiscovery:
    kind = "file"

    def __init__(self, store: Path) -> None:
        self.store = store
        shutil.rmtree(store, ignore_errors=True)  # stale registrations would count as instances

    def env(self) -> dict[str, str]:
        return {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(self.store)}

    def instance_ids(self, system_port: int) -> set[int]:
        return registrations.instance_ids(self.store, system_port)

    def remove(self, ids: set[int]) -> list[str]:
        return registrations.remove(self.store, ids)

    def __str__(self) -> str:
        return str(self.store)


class EtcdDiscovery:
    """A pool's own etcd (`etcd.Cluster`), started by the pool."""

    kind = "etcd"

    def __init__(self, cluster: etcd.Cluster) -> None:
        self.cluster = cluster

    def env(self) -> dict[str, str]:
        return {"DYN_DISCOVERY_BACKEND": "etcd", **self.cluster.env()}

    def instance_ids(self, system_port: int) -> set[int]:
        cards = [registrations.parsed(value) for value, _ in self.cluster.entries(CARDS).values()]
        endpoints = {key.rsplit("/", 1)[-1] for key in self.cluster.entries(ENDPOINTS)}
        return registrations.served_from(cards, endpoints, system_port)

    def remove(self, ids: set[int]) -> list[str]:
        """Revoke each instance's lease: its id (Dynamo 1.6.1), and every key it holds."""
        return [f"lease {i:x}" for i in sorted(ids) if self.cluster.revoke(i)]

    def __str__(self) -> str:
        return f"etcd at {self.cluster.endpoints}"
