"""A sampling request's text across a move (cases.SAMPLINGS): judged as every other against the
reference the backend computed (`continuity.check`); here, what that judgement needs beside
it. The reference must decide the text (`Backend.undecided`). The case must tell a successor
that kept the request's sampling from one that went wrong: the texts such successors give
after the tokens the move carried (`Backend.restarted`: one that began its sampling state
afresh, one not given the request's sampling) must not all be the reference's, or the case
proves nothing of the move. A text that departs from the reference and is exactly one of
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
    wrong_successors: Callable[[int], dict[str, str]]


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
    wrong = {
        way: text for way, text in sampled.wrong_successors(carried).items() if text != reference
    }
    if not wrong:
        found.unproven.append(
            f"a successor that began its sampling state at the move, or was not given it, "
            f"gives the reference's text too ({carried} tokens carried): the case cannot tell"
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
