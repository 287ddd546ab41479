"""Token continuity of a completed response: no token lost and none repeated across the
migration. What the stream gives to check it with (OpenAI-compatible frames carry no token
index): one response id on every frame, the text of each frame and when the client read it,
exactly one finish reason, the usage frame, and, where the backend can count tokens in text,
the tokens themselves. Around it, what the deployment tells: the prompt's length as the
frontend tokenized it, and when the worker that took the request over logged receiving it.

What each backend allows:
- a backend that can count the tokens of its output text (`Backend.output_tokens`; the word
  tokenizer's tokens are one word each) gets the tokens the client received counted against
  `max_tokens` and against usage, so a dropped or repeated frame shows as a count that is off
  by its size; where every frame holds one token (`Backend.one_token_per_frame`, the mocker),
  each frame is checked too. A real engine may put two tokens in one frame when the frontend
  reads its stream late;
- the re-issued context, for every backend that counts tokens, on a stream: after a migration
  `usage.prompt_tokens` is the context the frontend re-issued (prompt plus the tokens it had
  generated). It must be the prompt plus exactly the tokens the client read before the new
  worker's first one. Where the new worker's tokens begin is the migration's pause in the
  client's reading (`boundary`): certain when that pause ends after the new worker received the
  request, is longer than a loaded client's stall can pass for, stands out from every other gap
  near it, and is not followed by frames read back to back (a client that fell behind). Then a
  token replayed (the client has it, the context does not) or lost (the context has it, the
  client does not) at the migration fails the case, even with the total still at `max_tokens`.
  Where the pause is ambiguous, only what causality proves is checked: every token the client
  read before the new worker received the request must be in the context (a replay still fails;
  a loss cannot be told from a late read), and a note says so. A token lost or repeated away
  from the migration, with the total unchanged, is invisible wherever token identity is random
  (the mocker): frames carry no index;
- a backend with a reference (`Backend.reference`: vLLM's built-in model on the CPU) gets every
  response compared with it, token for token, and the first differing token named; a
  deterministic backend without one (the GPU engines) gets its migrated text compared so with
  an undisturbed baseline of the same request, served by the deployment first;
- otherwise what cannot be checked is said in a note, not pretended: the mocker draws its
  tokens at random, so its migrated text is never compared with a baseline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from handoff.client import Response
from handoff.machine.worker_logs import receipts

TokenCounter = Callable[[str], int | None]

#: How far after the first frame the client read once the new worker had the request the
#: migration's pause may end: past the faulted worker's last frames still on their way, and
#: the new worker's prefill. A client's stall further on cannot be taken for the pause.
TAKEOVER_WINDOW_S = 0.1
#: How much longer than any gap after it in that window the pause must be to be the pause: the
#: new worker's prefill against its own late decode steps.
DISTINCT = 1.5
#: Frames read closer together than this after the pause had queued up at a client that fell
#: behind: a worker's tokens come a decode step apart.
BURST_S = 0.001
#: The least pause that can be the migration's for certain: a client, or the frontend, on a
#: loaded machine stalls for tens of milliseconds at times, and a stall just after the new
#: worker's first frames looks like the migration's pause (seen once in a loaded test run: a
#: 33 ms stall two frames after the real boundary, which would have read as "2 replayed").
MIN_PAUSE_S = 0.2


@dataclass
class Continuity:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Takeover:
    """The worker that took the request over, and when (monotonic) it logged receiving it."""

    worker: str
    received_at: float


@dataclass(frozen=True)
class Migration:
    """What the deployment says about the request beside the stream: the prompt's length as the
    frontend tokenized it, when the fault was sent (monotonic), and the takeover if any."""

    prompt_tokens: int
    fault_at: float
    takeover: Takeover | None


@dataclass(frozen=True)
class Boundary:
    """Where the new worker's frames begin in the client's reading: `index` is the first of
    them; `certain` says whether the timing rules out every other place, `why` how."""

    index: int
    certain: bool
    why: str


def check(
    response: Response,
    max_tokens: int,
    count: TokenCounter,
    baseline: str | None = None,
    why_no_baseline: str = "the output is not deterministic",
    compared_with: str = "the undisturbed baseline",
    one_token_per_frame: bool = False,
    migration: Migration | None = None,
) -> Continuity:
    """Continuity of a completed `response` (status 200, no error frame); with `migration`,
    its re-issued context too."""
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
    if migration is not None:
        result.problems += context_problems(response, max_tokens, count, migration, result.notes)
    if baseline is None:
        result.notes.append(f"content not compared with a baseline: {why_no_baseline}")
    elif (at := first_divergence(baseline, response.text)) is not None:
        token = differing_token(baseline, response.text, at, count)
        where = f"token {token} (character {at})" if token is not None else f"character {at}"
        result.problems.append(
            f"the migrated text departs from {compared_with} at {where}: "
            f"{baseline[at : at + 40]!r} expected, {response.text[at : at + 40]!r} received"
        )
    else:
        result.notes.append(f"the migrated text equals {compared_with} exactly")
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


def takeover(logs: Mapping[str, Path], response_id: str) -> Takeover | None:
    """The worker among `logs` (name -> log file) that logged receiving the request last, and
    when, on the monotonic clock; None if none did. A worker logs the line before it generates,
    so once the client has read the whole response the line is written."""
    request_id = response_id.split("-", 1)[-1]  # chatcmpl-<uuid> -> <uuid>
    wall_minus_monotonic = time.time() - time.monotonic()
    seen = []
    for name, path in logs.items():
        for stamp, received_id in receipts(path):
            if received_id == request_id:
                wall = datetime.fromisoformat(stamp).timestamp()
                seen.append((wall - wall_minus_monotonic, name))
    if not seen:
        return None
    at, name = max(seen)
    return Takeover(name, at)


def boundary(times: list[float], fault_at: float, taken: Takeover) -> Boundary:
    """The migration's pause in the client's reading of content frames (monotonic `times`):
    the longest gap that ends after the new worker received the request (its frames cannot
    come sooner), within `TAKEOVER_WINDOW_S` of the first frame read after that. A first frame
    read after the fault is measured from the fault."""

    def gap(i: int) -> float:
        return times[i] - (times[i - 1] if i else fault_at)

    after = [i for i, t in enumerate(times) if t > max(taken.received_at, fault_at)]
    if not after:
        return Boundary(len(times), False, f"no frame read after {taken.worker} received it")
    end = times[after[0]] + TAKEOVER_WINDOW_S
    candidates = [i for i in after if times[i] <= end]
    pause = max(candidates, key=gap)
    where = f"the {gap(pause) * 1000:.1f} ms pause before frame {pause + 1}"
    others = [gap(i) for i in candidates if i > pause]  # the new worker's own steps
    if gap(pause) < MIN_PAUSE_S:
        why = f"{where} is shorter than a stall of the client's can be ({MIN_PAUSE_S} s)"
        return Boundary(pause, False, why)
    if others and gap(pause) < DISTINCT * max(others):
        why = f"{where} is not {DISTINCT}x the {max(others) * 1000:.1f} ms gap after it"
        return Boundary(pause, False, why)
    if pause + 1 < len(times) and gap(pause + 1) < BURST_S:
        why = f"{where} is followed by frames read back to back: the client had fallen behind"
        return Boundary(pause, False, why)
    return Boundary(pause, True, f"{where}, after {taken.worker} received the request")


def context_problems(
    response: Response,
    max_tokens: int,
    count: TokenCounter,
    migration: Migration,
    notes: list[str],
) -> list[str]:
    """The re-issued context against what the client had read before the new worker's first
    token: `usage.prompt_tokens` is the prompt plus the tokens the context carried."""
    context = (response.usage or {}).get("prompt_tokens")
    if context is None:
        return ["the response has no usage.prompt_tokens: the re-issued context is unknown"]
    prompt, taken = migration.prompt_tokens, migration.takeover
    carried = context - prompt
    if carried < 0:
        return [f"usage.prompt_tokens is {context}, below the {prompt} of the prompt"]
    if taken is None:
        if carried:
            return [
                f"usage.prompt_tokens is {context}, the prompt's {prompt} plus {carried}, but no "
                f"worker but the faulted one logged receiving the request"
            ]
        notes.append("no other worker received the request: its context was never re-issued")
        return []
    frames = [(c.at, count(c.text)) for c in response.chunks if c.text]
    counts = [n for _, n in frames if n is not None]
    if len(frames) < 2 or len(counts) < len(frames):
        why = "the client read the response whole" if len(frames) < 2 else "tokens not counted"
        notes.append(
            f"the re-issued context (the prompt plus {carried} tokens) not compared with what "
            f"the client had when {taken.worker} took over: {why}"
        )
        return []
    context_is = f"the re-issued context carried {carried} (usage.prompt_tokens {context} "
    context_is += f"- prompt {prompt})"
    early = sum(n for (t, _), n in zip(frames, counts, strict=True) if t < taken.received_at)
    if early > carried:  # certain: the new worker had not received the request yet
        return [
            f"the client had read {early} tokens before {taken.worker} received the re-issued "
            f"request, but {context_is}: {early - carried} replayed at the migration"
        ]
    edge = boundary([t for t, _ in frames], migration.fault_at, taken)
    if not edge.certain:
        notes.append(
            f"where {taken.worker}'s tokens begin is ambiguous ({edge.why}): checked only that "
            f"the context holds the {early} tokens the client read before {taken.worker} "
            f"received the request; a token lost at the migration would not show"
        )
        return []
    before = sum(counts[: edge.index])
    if before > carried:
        return [
            f"the client read {before} tokens before {taken.worker}'s first ({edge.why}), but "
            f"{context_is}: {before - carried} replayed at the migration"
        ]
    if before < carried:
        also = ", and as many repeated after it" if sum(counts) == max_tokens else ""
        return [
            f"the client read {before} tokens before {taken.worker}'s first ({edge.why}), but "
            f"{context_is}: {carried - before} lost at the migration{also}"
        ]
    notes.append(
        f"the re-issued context is the prompt plus exactly the {before} tokens the client read "
        f"before {taken.worker}'s first ({edge.why})"
    )
    return []
