"""The contract a backend plugin fulfils: facts about one inference engine, no orchestration."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from handoff.errors import HandoffError

if TYPE_CHECKING:
    from handoff.cases import Case
    from handoff.processes import ManagedProcess


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
class Shape:
    """The request of a case: a prompt of a known token length and a fixed output length."""

    prompt: str
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class Worker:
    """A started worker: its role, its process and the ports handoff allocated for it."""

    name: str
    role: str
    process: ManagedProcess
    ports: Mapping[str, int]


class Backend(ABC):
    """One inference engine as handoff sees it. Subclass it and register an instance.

    Class attributes are the facts core reads:
    - `name` (the `--handoff-backend` value) and `version`;
    - `topologies`: for each supported topology, the roles of its workers in launch order;
    - `unsupported`: for each topology it does not run, why (shown by `handoff cases`);
    - `worker_ports`: names of the ports each worker needs (core allocates them on loopback);
    - `migration_counts`: "exact" when the frontend's migration counters must equal the
      expectation, "lower_bound" when the engine may legitimately migrate more than once;
    - `case_timeout_s`: the most one case may take, start-up to teardown (the timeout marker).
    """

    name: str
    version: str
    topologies: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    unsupported: ClassVar[Mapping[str, str]] = {}
    worker_ports: tuple[str, ...] = ("system",)
    migration_counts: Literal["exact", "lower_bound"] = "exact"
    case_timeout_s: float = 120.0

    def why_not(self, topology: str) -> str | None:
        """Why this backend does not run `topology`; None when it does."""
        if topology in self.topologies:
            return None
        return self.unsupported.get(topology, "not declared by the backend")

    def roles(self, topology: str) -> tuple[str, ...]:
        """The worker roles of `topology`, or an error saying why it is not supported."""
        if why := self.why_not(topology):
            raise HandoffError(f"backend {self.name!r} does not run {topology} cases: {why}")
        return self.topologies[topology]

    @abstractmethod
    def check_environment(self) -> None:
        """Raise HandoffError naming what is missing (engine, binary) and how to get it."""

    @abstractmethod
    def prepare_model(self, folder: Path) -> Model:
        """Make the model available under `folder` (or point elsewhere) and describe it."""

    @abstractmethod
    def shape(self, case: Case) -> Shape:
        """The prompt and output length of `case`'s request; the output must outlast the fault
        (the graceful bound included), or the case fails as not in flight at the fault."""

    @abstractmethod
    def worker(self, role: str, case: Case, model: Model, ports: Mapping[str, int]) -> Launch:
        """The command and environment that start one worker of `case` in `role`."""

    @abstractmethod
    def holders(self, workers: Sequence[Worker]) -> list[Worker]:
        """The workers that report a request in flight right now, from their own state."""

    def kv_transfer_floor_s(self, case: Case) -> float | None:
        """The least time the KV transfer of `case`'s prompt takes, or None if unknown: a first
        token sooner than this proves no transfer happened (kv_transfer cases)."""
        return None
