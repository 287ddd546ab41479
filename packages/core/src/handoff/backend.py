"""The contract a backend plugin fulfils: facts about one inference engine, no orchestration."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from handoff.errors import HandoffError

if TYPE_CHECKING:
    from handoff.processes import ManagedProcess

#: Roles a worker can play; which ones a deployment needs follows from its topology.
ROLES = ("aggregate", "prefill", "decode")


@dataclass(frozen=True)
class Model:
    """What every process of a deployment serves: the name clients ask for and where it lives."""

    name: str
    path: Path


@dataclass(frozen=True)
class Launch:
    """A worker's command line and the environment it needs on top of the runtime's."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Worker:
    """A started worker: its role, its process and the ports handoff allocated for it."""

    name: str
    role: str
    process: ManagedProcess
    ports: Mapping[str, int]


class Backend(ABC):
    """One inference engine as handoff sees it. Subclass it and register an instance.

    Class attributes are the facts core reads: `name` (the `--backend` value), `version`,
    `topologies` it supports, `worker_ports` (names of the ports each worker needs; core allocates
    them on loopback), and `migration_counts`: "exact" when the frontend's migration counters must
    equal the expectation, "lower_bound" when the engine may legitimately migrate more than once.
    """

    name: str
    version: str
    topologies: tuple[str, ...] = ("aggregate",)
    worker_ports: tuple[str, ...] = ("system",)
    migration_counts: Literal["exact", "lower_bound"] = "exact"
    #: Seconds one case may take at most, start-up to teardown; the `timeout` marker's value.
    case_timeout_s: float = 120.0

    def require_topology(self, topology: str) -> None:
        """Raise HandoffError unless this backend supports `topology`."""
        if topology not in self.topologies:
            raise HandoffError(
                f"backend {self.name!r} does not support topology {topology!r}: "
                f"use one of {', '.join(self.topologies)}"
            )

    @abstractmethod
    def check_environment(self) -> None:
        """Raise HandoffError naming what is missing (engine, binary) and how to get it."""

    @abstractmethod
    def prepare_model(self, folder: Path) -> Model:
        """Make the model available under `folder` (or point elsewhere) and describe it."""

    @abstractmethod
    def worker(self, role: str, model: Model, plane: str, ports: Mapping[str, int]) -> Launch:
        """The command and environment that start one worker in `role` on the given ports."""

    @abstractmethod
    def holders(self, workers: Sequence[Worker]) -> list[Worker]:
        """The workers that report a request in flight right now, from their own state."""
