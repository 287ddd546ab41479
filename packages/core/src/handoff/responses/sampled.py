"""A sampling request's text across a move (cases.SAMPLINGS): judged as every other against the
reference the backend computed (`continuity.check`); here, what that judgement needs beside
it. The reference must decide the text (`Backend.undecided`). The case must tell a successor
that kept the request's sampling from each that went wrong (`Backend.wrong_successors`: one
that began its sampling state afresh at the move, one not given the request's sampling): the
reference's text must be one that no wrong successor may give after the tokens the move
carried (`Backend.follows`: each token its computed choice, or within a close call of it), or
the case proves nothing of that way. A text that departs from the reference and is one that
exactly one wrong successor may give is named by it: Dynamo's migration document says a move
cannot carry penalties on generated tokens (`policies.KNOWN_DIVERGENCES`); a text that more
than one may give leaves the cause unproven; any other departure is a plain failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from handoff import continuity
from handoff.client import Response
from handoff.policies import RESUMED_AFRESH, RESUMED_AFRESH_WITNESS

DEPARTS = "the migrated text departs from"


@dataclass(frozen=True)
class Sampled:
    """What a sampling request's verdict needs of the backend: why its reference is undecided,
    if it is, the ways its successor can go wrong, and whether a text after n tokens carried
    is one a successor gone wrong one way may give (`Backend.follows`, given n, way, text)."""

    undecided: str | None
    ways: tuple[str, ...]
    follows: Callable[[int, str, str], bool]


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
    blind = [way for way in sampled.ways if sampled.follows(carried, way, reference)]
    if not sampled.ways or blind:
        why = f"{blind[0]} may give" if blind else "no wrong successor is known to give other than"
        found.unproven.append(
            f"{why} the reference's text ({carried} tokens carried): the case cannot tell it"
        )
        return
    departures = [p for p in found.problems if p.startswith(DEPARTS)]
    if not departures:
        ways = "; ".join(sampled.ways)
        found.notes.append(f"the text is the reference's, which no wrong successor gives ({ways})")
        return
    ways = [way for way in sampled.ways if sampled.follows(carried, way, response.text)]
    named(found, departures, ways, carried)


def named(
    found: continuity.Continuity, departures: list[str], ways: list[str], carried: int
) -> None:
    """A departure that the `ways` a text may come from explain: one names it, token for token
    what such a successor gives; more leave its cause unproven, the departure standing."""
    if len(ways) > 1:
        found.unproven.append(
            f"the text is one that {' and '.join(ways)} may each give ({carried} tokens "
            f"carried): the case cannot tell which"
        )
    elif ways:
        found.problems = [p for p in found.problems if p not in departures]
        found.problems.append(
            f"{ways[0]}: the text is what such a successor gives after the {carried} tokens the "
            f"move carried, token for token ({departures[0]})"
        )
        if ways[0] == RESUMED_AFRESH:
            found.witnessed[RESUMED_AFRESH_WITNESS.key] = (
                True,
                f"replayed from the {carried} tokens the move carried, the text is what a "
                f"successor whose sampling state began there gives, and no other way's",
            )
        continuity.settle_boundary(found, f"what such a successor gives after {carried} tokens")
