"""Token continuity of a completed response: no token lost and none repeated across the
migration. What the stream gives to check it with (OpenAI-compatible frames carry no token
index): one response id on every frame, the text of each frame, exactly one finish reason,
the usage frame, and, where the backend can count tokens in text, the tokens themselves.

What each backend allows:
- a backend that can count the tokens of its output text (`Backend.output_tokens`; the word
  tokenizer's tokens are one word each) gets the tokens the client received counted against
  `max_tokens` and against usage, so a dropped or repeated frame shows as a count that is off
  by its size (where in the stream cannot be told: the frames carry no index); where every
  frame holds one token (`Backend.one_token_per_frame`, the mocker), each frame is checked too.
  A real engine may put two tokens in one frame when the frontend reads its stream late;
- a deterministic backend (temperature 0, fixed seed: vLLM and the GPU engines) also gets its
  migrated text compared with an undisturbed baseline of the same request, token for token,
  and the first differing token named;
- otherwise what cannot be checked is said in a note, not pretended: the mocker draws its
  tokens at random, so its migrated text is never compared with a baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from handoff.client import Response

TokenCounter = Callable[[str], int | None]


@dataclass
class Continuity:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check(
    response: Response,
    max_tokens: int,
    count: TokenCounter,
    baseline: str | None = None,
    why_no_baseline: str = "the output is not deterministic",
    one_token_per_frame: bool = False,
) -> Continuity:
    """Continuity of a completed `response` (status 200, no error frame)."""
    result = Continuity()
    frames = response.chunks
    ids = {c.data.get("id") for c in frames}
    if len(ids) > 1:
        result.problems.append(f"the response changed its id mid-stream: {sorted(map(str, ids))}")
    finishes = [c.choice.get("finish_reason") for c in frames if c.choice.get("finish_reason")]
    if len(finishes) != 1:
        result.problems.append(f"{len(finishes)} finish reasons in the response, expected 1")
    result.problems += token_problems(
        response, max_tokens, count, result.notes, one_token_per_frame
    )
    if baseline is None:
        result.notes.append(f"content not compared with a baseline: {why_no_baseline}")
    elif (at := first_divergence(baseline, response.text)) is not None:
        token = differing_token(baseline, response.text, at, count)
        where = f"token {token} (character {at})" if token is not None else f"character {at}"
        result.problems.append(
            f"the migrated text departs from the undisturbed baseline at {where}: "
            f"{baseline[at : at + 40]!r} expected, {response.text[at : at + 40]!r} received"
        )
    else:
        result.notes.append("the migrated text equals the undisturbed baseline exactly")
    return result


def differing_token(expected: str, received: str, at: int, count: TokenCounter) -> int | None:
    """Which token (from 1) of the output first differs, for tokens that are whitespace-
    separated words: the tokens wholly before character `at` agree."""

    def boundary(text: str) -> bool:
        return at >= len(text) or text[at].isspace()

    common = expected[:at]
    agreed = common if boundary(expected) and boundary(received) else common.rpartition(" ")[0]
    tokens = count(agreed)
    return None if tokens is None else tokens + 1


def token_problems(
    response: Response,
    max_tokens: int,
    count: TokenCounter,
    notes: list[str],
    one_token_per_frame: bool,
) -> list[str]:
    """Tokens per frame and in all, where the backend can count them in text."""
    per_frame = [count(c.text) for c in response.chunks if c.text]
    if any(n is None for n in per_frame):
        notes.append(
            "tokens not counted in the text: this backend cannot count them without a "
            "tokenizer; usage and the finish reason are checked"
        )
        return []
    problems = []
    if one_token_per_frame and len(response.chunks) > 1:  # a stream, a token a frame
        odd = [(i, n) for i, n in enumerate(per_frame, 1) if n != 1]
        if odd:
            problems.append(f"content frame {odd[0][0]} holds {odd[0][1]} tokens, expected 1")
    total = sum(n for n in per_frame if n is not None)
    if total != max_tokens:
        what = "lost" if total < max_tokens else "repeated"
        problems.append(
            f"the client received {total} tokens, expected {max_tokens}: "
            f"{abs(max_tokens - total)} {what}"
        )
    usage = response.completion_tokens
    if usage is not None and usage != total:
        problems.append(f"usage says {usage} completion tokens, the client received {total}")
    return problems


def first_divergence(expected: str, received: str) -> int | None:
    """The first character index where the texts differ; None when they are equal."""
    for i, (a, b) in enumerate(zip(expected, received, strict=False)):
        if a != b:
            return i
    return None if len(expected) == len(received) else min(len(expected), len(received))
