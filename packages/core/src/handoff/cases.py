"""The case model: axes, cases with stable ids, and the published selections per topology.

Case ids are published (CI dashboards key on them): they never change once released.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from handoff.covering import format_pair, missing_pairs, product_rows
from handoff.errors import HandoffError

POLICIES = (
    "migration_enabled",
    "migration_disabled",
    "max_seq_len_exceeded",
    "max_seq_len_not_exceeded",
)
FAULTS = ("worker_failure", "graceful_shutdown")
APIS = ("chat", "completion")
RESPONSES = ("stream", "unary")
PLANES = ("nats", "tcp")
TOPOLOGIES = ("aggregate", "prefill", "decode", "kv_transfer")

#: The five axes that make a case id, in id order; topology names the selection a case is in.
AXES: dict[str, tuple[str, ...]] = {
    "policy": POLICIES,
    "fault": FAULTS,
    "api": APIS,
    "response": RESPONSES,
    "plane": PLANES,
}

SELECTIONS = ("pre_merge", "nightly")


@dataclass(frozen=True)
class Case:
    """One value per axis. `id` joins the five id axes with '-' in AXES order."""

    policy: str
    fault: str
    api: str
    response: str
    plane: str
    topology: str = "aggregate"

    def __post_init__(self) -> None:
        for f in fields(self):
            allowed = TOPOLOGIES if f.name == "topology" else AXES[f.name]
            value = getattr(self, f.name)
            if value not in allowed:
                raise HandoffError(f"unknown {f.name} {value!r}: use one of {', '.join(allowed)}")

    @property
    def id(self) -> str:
        return "-".join(getattr(self, axis) for axis in AXES)

    @property
    def key(self) -> str:
        """Unique across topologies: `aggregate/<id>`; the pytest item id and log folder name."""
        return f"{self.topology}/{self.id}"

    @classmethod
    def from_id(cls, case_id: str, topology: str = "aggregate") -> Case:
        values = case_id.split("-")
        if len(values) != len(AXES):
            raise HandoffError(
                f"malformed case id {case_id!r}: expected {'-'.join(AXES)}, "
                f"e.g. migration_enabled-worker_failure-chat-stream-nats"
            )
        return cls(*values, topology=topology)

    def row(self) -> dict[str, str]:
        return {axis: getattr(self, axis) for axis in AXES}


#: Aggregate pre-merge: eight published rows covering every pair of values of the five axes.
AGGREGATE_PRE_MERGE = tuple(
    Case.from_id(case_id)
    for case_id in (
        "migration_enabled-worker_failure-chat-stream-nats",
        "migration_enabled-graceful_shutdown-completion-unary-tcp",
        "migration_disabled-worker_failure-chat-unary-tcp",
        "migration_disabled-graceful_shutdown-completion-stream-nats",
        "max_seq_len_exceeded-worker_failure-completion-stream-tcp",
        "max_seq_len_exceeded-graceful_shutdown-chat-unary-nats",
        "max_seq_len_not_exceeded-worker_failure-completion-unary-nats",
        "max_seq_len_not_exceeded-graceful_shutdown-chat-stream-tcp",
    )
)

#: Aggregate nightly: the full 4x2x2x2x2 product.
AGGREGATE_NIGHTLY = tuple(Case(**row) for row in product_rows(AXES))

_SELECTIONS: dict[tuple[str, str], tuple[Case, ...]] = {
    ("aggregate", "pre_merge"): AGGREGATE_PRE_MERGE,
    ("aggregate", "nightly"): AGGREGATE_NIGHTLY,
}


def selection(topology: str, name: str) -> tuple[Case, ...]:
    """The published cases of one topology and selection."""
    if name not in SELECTIONS:
        raise HandoffError(f"unknown selection {name!r}: use one of {', '.join(SELECTIONS)}")
    try:
        return _SELECTIONS[(topology, name)]
    except KeyError:
        known = sorted({t for t, _ in _SELECTIONS})
        raise HandoffError(
            f"no {name} selection for topology {topology!r}: use one of {', '.join(known)}"
        ) from None


def uncovered_pairs(cases: tuple[Case, ...] | list[Case]) -> list[str]:
    """Every pair of axis values that no case covers, named; empty when the pairs all hold."""
    return [format_pair(p) for p in missing_pairs(AXES, [c.row() for c in cases])]
