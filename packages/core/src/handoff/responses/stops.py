"""A request that must end at a stop string across its move (the `stop` topology) or wholly
after it (`stop_after`), or pass one that `min_tokens` covers and end at the next (`min_tokens`).

Dynamo's frontend matches stop strings itself and holds back from the client whatever may be
one's start, so the user sees only the text before the string. Across the move, every token
the new worker generates is inside the string, and the match completing, at the count its end
gives, is what shows they were right; after it, the new worker's tokens before the string are
compared too. The move must fall where the case says (inside the match, or before the string),
or the case proves nothing of it: that is "not proven", never a pass. Every token's
log-probabilities, the string's held back too (`held_back`), tell whether the engine continued
the true context (responses.evidence), which the text alone cannot.
"""

from __future__ import annotations

from handoff import continuity
from handoff.backend import Backend, Shape
from handoff.client import Request, Response, Stop
from handoff.errors import HandoffError

#: Tokens the request may still generate after its stop string's end: a response that misses
#: its stop runs on to `max_tokens`, past the string, where the count and the finish show it.
RUN_PAST = 16
#: A `min_tokens` request's stop strings: two words each, the first ending `MIN_TOKENS_GAP`
#: tokens before `min_tokens` (the output's middle, far after the fault), the second beginning
#: there: a count off by one either way still tells them apart.
MIN_TOKENS_WORDS = 2
MIN_TOKENS_GAP = 2


def planned(backend: Backend, api: str, shape: Shape, in_flight_tokens: int, kind: str) -> Stop:
    """The stop string of `shape`'s request (`kind`: its topology's request). "stop": from the
    reference output's token after the `in_flight_tokens` the client must see before the
    fault, to `RUN_PAST` short of `max_tokens`; "stop_after": the same from the output's
    middle, far after the fault; "min_tokens": two short ones around the middle, the first
    covered by `min_tokens`."""
    if kind == "min_tokens":
        return min_tokens_planned(backend, api, shape)
    ends = shape.max_tokens - RUN_PAST
    begins = in_flight_tokens if kind == "stop" else shape.max_tokens // 2
    return Stop(stop_text(backend, api, shape, begins, ends), begins, ends, kind == "stop")


def min_tokens_planned(backend: Backend, api: str, shape: Shape) -> Stop:
    """Stop strings around `min_tokens` (the output's middle): the first ends before it, the
    second begins at it. The second matches nowhere before (the text owed ends there), the
    first nowhere from its place to the second's end (a kept `min_tokens` passes it once)."""
    least = shape.max_tokens // 2
    first = least - MIN_TOKENS_GAP - MIN_TOKENS_WORDS
    ends = least + MIN_TOKENS_WORDS
    skipped = stop_text(backend, api, shape, first, least - MIN_TOKENS_GAP)
    text = stop_text(backend, api, shape, least, ends)
    window = stop_text(backend, api, shape, first, ends)
    if stop_text(backend, api, shape, 0, ends).count(text) != 1 or window.count(skipped) != 1:
        raise HandoffError(
            f"the stop strings {skipped!r} and {text!r} around min_tokens {least} match again "
            f"where planned only once: this output cannot tell a lost min_tokens from a kept one"
        )
    return Stop(text, least, ends, False, skipped, first, least)


def stop_text(backend: Backend, api: str, shape: Shape, begins: int, ends: int) -> str:
    text = backend.stop_text(api, shape, begins, ends) if ends > begins else None
    if text is None:
        raise HandoffError(
            f"backend {backend.name!r} cannot plan a stop string over tokens {begins}-{ends} of "
            f"a {shape.max_tokens}-token output: a stop case needs the engine's output known "
            f"in advance (Backend.stop_text)"
        )
    return text


def owed_before(reference: tuple[str | None, str], stop: Stop) -> tuple[str | None, str]:
    """What a request owes with `stop`: the reference text before the string's first match."""
    text, name = reference
    if text is None:
        return reference
    if stop.text not in text:
        raise HandoffError(f"the stop string is not in {name}: {stop.text[:40]!r}...")
    return text[: text.index(stop.text)], f"{name} before its stop string"


def held_back(request: Request, response: Response) -> str:
    """What the frontend held back of a response that ended at its stop string (finish
    "stop"): that string. Dynamo 1.6.1 gives the client the text before it, with the space
    that parts them, and every token's log-probabilities, the string's included (in frames of
    no text, or in the last that has some; measured on vLLM's CPU engine), so those tokens are
    judged too (`evidence.told_logprobs`). A response that ran on to its length was given its
    whole text: nothing held. One that ended at another string than owed fails by its text and
    count; judged after the owed one, its log-probabilities depart there too."""
    if request.stop is None or response.finish_reason != "stop":
        return ""
    return request.stop.text


def check(
    request: Request,
    response: Response,
    owed: str | None,
    compared_with: str,
    migration: continuity.Migration | None,
) -> continuity.Continuity:
    """A completed stop request: one id and one finish reason, the text before the string as
    owed, and after a move its place inside the match (`where_it_moved`)."""
    assert request.stop is not None
    found = continuity.Continuity(problems=continuity.framing_problems(response))
    if owed is None:
        found.unproven.append("the text before the stop string is unknown: nothing to compare")
    elif (at := continuity.first_divergence(owed, response.text)) is not None:
        found.problems.append(
            f"the text departs from {compared_with} at character {at}: "
            f"{owed[at : at + 40]!r} expected, {response.text[at : at + 40]!r} received"
        )
    if migration is not None and migration.moved:
        where_it_moved(response, request.stop, migration, found)
    return found


def where_it_moved(
    response: Response, stop: Stop, migration: continuity.Migration, found: continuity.Continuity
) -> None:
    """The tokens the move carried, as the frontend tells them (`usage.prompt_tokens` less the
    prompt it counted: Dynamo 1.6.1 counts the re-issued context there), inside the match: the
    string begun before the move and not yet ended. A reading missing is not proven; a context
    shorter than what the frontend had received, or one no other worker received, fails as in
    every other topology (`continuity.too_few_carried`)."""
    told, prompt = (response.usage or {}).get("prompt_tokens"), migration.prompt_tokens
    if told is None or prompt <= 0:
        missing = "the response's usage has no prompt_tokens"
        if told is not None:
            missing = f"the frontend counted {prompt} prompt tokens"
        found.unproven.append(f"where the move fell is unknown: {missing}")
        return
    carried = told - prompt
    if too_few := continuity.too_few_carried(told, migration):
        found.problems += too_few
    elif migration.takeover is None:
        found.problems.append(
            f"the frontend counted a move that carried {carried} tokens, but no worker but the "
            f"faulted one logged receiving the request"
        )
    elif stop.spans and carried <= stop.begins:
        found.unproven.append(
            f"the move carried {carried} tokens, the stop string begins after {stop.begins}: "
            f"its match did not span the move"
        )
    elif not stop.spans and carried >= (
        first := stop.begins if stop.skipped is None else stop.skipped_begins
    ):
        found.unproven.append(
            f"the move carried {carried} tokens, the stop string begins after {first}: the "
            f"move did not come before it"
        )
    elif carried >= stop.ends:
        found.problems.append(
            f"the move carried {carried} tokens, the whole stop string ({stop.ends}): the "
            f"faulted worker had ended it, and the response should have stopped before the fault"
        )
    elif stop.skipped is not None:
        found.notes.append(
            f"the move carried {carried} tokens, before the stop strings: the first (tokens "
            f"{stop.skipped_begins + 1}-{stop.skipped_begins + MIN_TOKENS_WORDS}) passed, inside "
            f"min_tokens {stop.min_tokens}; the second (tokens {stop.begins + 1}-{stop.ends}) "
            f"ended it as owed"
        )
    else:
        where = "inside the stop string" if stop.spans else "before the stop string"
        found.notes.append(
            f"the move carried {carried} tokens, {where} (tokens {stop.begins + 1}-"
            f"{stop.ends}): its match ended as owed"
        )
