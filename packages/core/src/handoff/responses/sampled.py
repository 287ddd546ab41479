"""A sampling request's text across a move (cases.SAMPLINGS): judged as every other against the
reference the backend computed (`continuity.check`); here, what that judgement needs beside
it. The reference must decide the text (`Backend.undecided`). The case must tell a successor
that kept the request's sampling from each that went wrong: the text each gives after the
tokens the move carried (`Backend.restarted`: one that began its sampling state afresh, one
not given the request's sampling) must differ from the reference's, or the case proves nothing
of that way. A text that departs from the reference and is exactly one of
theirs is named by it: Dynamo's migration document says a move cannot carry penalties on
generated tokens (`policies.KNOWN_DIVERGENCES`); any other departure is a plain failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from handoff import continuity
from handoff.client import Response

DEPARTS = "the migrated text departs from"


@dataclass(frozen=True)
class Sampled:
    """What a sampling request's verdict needs of the backend: why its reference is undecided,
    if it is, and by how a successor went wrong, the text it gives after n tokens carried."""

    undecided: str | None
    #: By how a successor went wrong, its text after n tokens carried (None: a close call).
    wrong_successors: Callable[[int], dict[str, str | None]]


def check(
    found: continuity.Continuity,
    response: Response,
    reference: str | None,
    sampled: Sampled,
    migration: continuity.Migration | None,
) -> None:
    """Add to `found` (the response judged whole) what its sampling tells."""
    if sampled.undecided is not None:
        found.unproven.append(sampled.undecided)
        return
    if migration is None or not migration.moved or reference is None:
        return
    told = (response.usage or {}).get("prompt_tokens")
    if told is None or migration.prompt_tokens <= 0:
        found.unproven.append(
            "where the move fell is unknown (no usage.prompt_tokens): what a successor that went "
            "wrong there gives cannot be computed"
        )
        return
    carried = told - migration.prompt_tokens
    wrong = sampled.wrong_successors(carried)
    if undecided := [way for way, text in wrong.items() if text is None]:
        found.unproven.append(
            f"{undecided[0]}: what such a successor gives after {carried} tokens carried is a "
            f"close call, undecided: the case cannot tell it"
        )
        return
    if not wrong or (same := [way for way, text in wrong.items() if text == reference]):
        why = f"{same[0]} gives" if wrong else "no wrong successor's text is known, nor"
        found.unproven.append(
            f"{why} the reference's text too ({carried} tokens carried): the case cannot "
            f"tell it from a kept state"
        )
        return
    departures = [p for p in found.problems if p.startswith(DEPARTS)]
    ways = "; ".join(wrong)
    if not departures:
        found.notes.append(f"the text is the reference's, not a wrong successor's ({ways})")
    elif way := next((w for w, text in wrong.items() if text == response.text), None):
        found.problems = [p for p in found.problems if p not in departures]
        found.problems.append(
            f"{way}: the text is exactly what such a successor gives after the {carried} "
            f"tokens the move carried ({departures[0]})"
        )
        continuity.settle_boundary(found, f"what such a successor gives after {carried} tokens")
