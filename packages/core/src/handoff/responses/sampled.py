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
    #: By how a successor went wrong, its text after n tokens carried and how many of its
    #: characters are decided (`Backend.restarted`).
    wrong_successors: Callable[[int], dict[str, tuple[str, int]]]


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
    blind = {way: tells(reference, text, decided) for way, (text, decided) in wrong.items()}
    if not wrong or (blinded := [way for way, why in blind.items() if why]):
        why = f"{blinded[0]} {blind[blinded[0]]}" if wrong else "no wrong successor's text is known"
        found.unproven.append(f"{why} ({carried} tokens carried): the case cannot tell it")
        return
    departures = [p for p in found.problems if p.startswith(DEPARTS)]
    ways = "; ".join(wrong)
    if not departures:
        found.notes.append(f"the text is the reference's, not a wrong successor's ({ways})")
    elif way := next((w for w, (t, n) in wrong.items() if response.text[:n] == t[:n]), None):
        text, decided = wrong[way]
        upto = "" if decided == len(text) else f" up to its first close call (character {decided})"
        found.problems = [p for p in found.problems if p not in departures]
        found.problems.append(
            f"{way}: the text is exactly what such a successor gives{upto} after the {carried} "
            f"tokens the move carried ({departures[0]})"
        )
        continuity.settle_boundary(found, f"what such a successor gives after {carried} tokens")


def tells(reference: str, text: str, decided: int) -> str | None:
    """Why a wrong successor's `text` cannot be told from the `reference`: it is the
    reference's, or it is the reference's up to a close call (its first `decided` characters).
    None where it departs from the reference before any close call."""
    at = continuity.first_divergence(reference, text)
    if at is None:
        return "gives the reference's text too"
    if at >= decided:
        return "gives the reference's text up to a close call, undecided after it"
    return None
