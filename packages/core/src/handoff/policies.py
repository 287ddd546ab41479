"""What each migration policy means: the frontend flags that set it, and what must follow.

The expected counters are what Dynamo 1.6.1 really produces after one fault mid-request
(observed, and pinned by the end-to-end cases): even a refused migration is counted as an
ongoing_request migration attempt, with a failed outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from handoff.errors import HandoffError

#: The limit Dynamo's own migration tests use when migration is on.
ENABLED_LIMIT = 3
#: A sequence cap no request of a case reaches, and one every request passes before the fault.
CAP_NOT_EXCEEDED = 1_000_000
CAP_EXCEEDED = 1


@dataclass(frozen=True)
class Policy:
    name: str
    migration_limit: int
    max_seq_len: int | None
    #: True: the response completes in full; False: the client sees an API error.
    completes: bool
    #: Expected frontend counters after one fault: ongoing_request, max_seq_len_exceeded,
    #: migrations that succeeded, migrations that failed. new_request is always 0.
    ongoing_request: int
    max_seq_len_exceeded: int
    succeeded: int
    failed: int

    def frontend_flags(self) -> list[str]:
        flags = ["--migration-limit", str(self.migration_limit)]
        if self.max_seq_len is not None:
            flags += ["--migration-max-seq-len", str(self.max_seq_len)]
        return flags


POLICIES = {
    p.name: p
    for p in (
        Policy("migration_enabled", ENABLED_LIMIT, None, True, 1, 0, 1, 0),
        Policy("migration_disabled", 0, None, False, 1, 0, 0, 1),
        Policy("max_seq_len_exceeded", ENABLED_LIMIT, CAP_EXCEEDED, False, 1, 1, 0, 1),
        Policy("max_seq_len_not_exceeded", ENABLED_LIMIT, CAP_NOT_EXCEEDED, True, 1, 0, 1, 0),
    )
}


def policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise HandoffError(f"unknown policy {name!r}: use one of {', '.join(POLICIES)}") from None
