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
  worker's first one. Every token the client read before the new worker could send its first
  (`could_start`: once it received the request, and not before the case's simulated KV
  transfer after the fault) is the faulted worker's: more than the context carried fail as
  replayed; as many, none was lost, which is certain by causality alone. Where the new
  worker's engine keeps a record of the context it received (`Backend.received_context`: the
  mocker's KV blocks with their token ids), the client's first tokens are compared with it
  token for token, which is certain. Else where the new worker's tokens begin is the
  migration's pause in the client's reading (`boundary`): certain when that pause ends after
  the new worker received the request, is `STANDS_OUT` times every other gap of the same
  stream (the stalls this run shows, on this machine), and is not followed by frames read
  back to back (a client that fell behind). Then a token replayed (the client has
  it, the context does not) or lost (the context has it, the client does not) at the
  migration fails the case, even with the total still at `max_tokens`. Where neither is
  certain, causality is still checked (every token the client read before the new worker
  received the request must be in the context: a replay still fails), and the rest of the
  check is not proven: a loss cannot be told from a late read. A token lost or repeated away
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
from itertools import accumulate
from pathlib import Path

from handoff import sequences
from handoff.client import Response
from handoff.machine.worker_logs import receipts

TokenCounter = Callable[[str], int | None]
#: The token ids of a piece of output text, where the backend can tell; None where it cannot.
TokenIds = Callable[[str], list[int] | None]

#: How many tokens past the re-issued context the new worker's first may sit for the boundary
#: to be looked for there (a replay of up to this many, named as such). It only picks where
#: to look: a pause further on is among the other gaps `STANDS_OUT` compares it with, so a
#: boundary outside stays ambiguous (and the count still fails a replay of more).
REPLAY_SPAN = 4
#: How many times every other gap of the same stream the pause must be to be the migration's
#: for certain. What a stall of the client, the frontend or an engine looks like is measured by
#: the run itself: the longest gap it shows anywhere else in the client's reading (a slower or
#: busier machine stalls longer, and needs a longer pause), not a number tuned on one machine.
STANDS_OUT = 2.0
#: Frames read closer together than this fraction of the stream's median gap (the engine's
#: step as the client saw it) had queued up at a client that fell behind.
BURST_FRACTION = 0.1
#: How many frames after the pause are looked at for such a burst: a client that fell behind
#: and stalls once more as it reads its queue (a busy machine) reads the rest back to back, so
#: the first gap after the pause alone can look like the engine's step.
BURST_LOOK = 4


@dataclass
class Continuity:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The checks this response exists for that could not be made, each with why.
    unproven: list[str] = field(default_factory=list)
    #: The runs of tokens, one a worker, where the tokens name their worker.
    runs: sequences.Runs | None = None
    #: A known defect's mechanism, where the text itself shows it (`Verdict.witnessed`).
    witnessed: dict[str, tuple[bool | None, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Takeover:
    """The worker that took the request over, and when (monotonic) it logged receiving it."""

    worker: str
    received_at: float


@dataclass(frozen=True)
class Migration:
    """What the deployment says about the request beside the stream: the prompt's length as the
    frontend tokenized it, when the fault was sent (monotonic), the takeover if any, whether the
    frontend counted a move, the new worker's own record of the tokens it holds after the
    prompt (the re-issued context, then what it generated; None where its engine gives none),
    and the least time its first token takes after the fault, where known."""

    prompt_tokens: int
    fault_at: float
    takeover: Takeover | None
    moved: bool = True
    received: list[int] | None = None
    #: The least time from the fault to the new worker's first token, where every request of
    #: the case waits for it (a KV transfer the backend simulates): the re-issued request is
    #: sent after the fault and waits for its own transfer.
    first_token_floor_s: float | None = None
    #: Tokens the frontend had received from the faulted worker before the fault (a unary
    #: response's in-flight proof): every one of them is in the context it re-issues.
    carried_at_least: int = 0
    #: Every worker whose log received the request, in order (the faulted one first), each
    #: with the number its tokens name (`Backend.token_worker`); None where one is unknown.
    served: list[tuple[str, int]] | None = None


@dataclass(frozen=True)
class Boundary:
    """Where the new worker's frames begin in the client's reading: `index` is the first of
    them; `certain` says whether the timing rules out every other place, `why` how."""

    index: int
    certain: bool
    why: str


def framing_problems(response: Response) -> list[str]:
    """One id for every frame, and one finish reason."""
    problems, frames = [], response.chunks
    named = {c.data.get("id") for c in frames}
    if len(named) > 1:
        problems.append(f"the response changed its id mid-stream: {sorted(map(str, named))}")
    finishes = [c.choice.get("finish_reason") for c in frames if c.choice.get("finish_reason")]
    if len(finishes) != 1:
        problems.append(f"{len(finishes)} finish reasons in the response, expected 1")
    return problems


def check(
    response: Response,
    max_tokens: int,
    count: TokenCounter,
    baseline: str | None = None,
    why_no_baseline: str = "the output is not deterministic",
    compared_with: str = "the undisturbed baseline",
    one_token_per_frame: bool = False,
    migration: Migration | None = None,
    ids: TokenIds | None = None,
    origin: sequences.TokenOrigin | None = None,
) -> Continuity:
    """Continuity of a completed `response` (status 200, no error frame); with `migration`,
    its re-issued context too (`ids`: the token ids of output text, where the backend tells;
    `origin`: the worker each names, where the backend's tokens tell it)."""
    result = Continuity(problems=framing_problems(response))
    result.problems += token_problems(
        response, max_tokens, count, result.notes, one_token_per_frame
    )
    told = told_runs(response, ids, origin)
    if told is not None:
        result.problems += told.problems
        result.runs = told
    if migration is not None:
        result.problems += served_problems(told, migration.served, result)
        result.problems += context_problems(
            response, max_tokens, count, migration, result, ids, told
        )
    if baseline is None and told is not None and told.lengths:
        result.notes.append(
            f"each token names the worker that generated it: {len(told.lengths)} run(s) of "
            f"{told.lengths} tokens, each compared token for token with its worker's own output"
        )
    elif baseline is None:
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
        settle_boundary(result, compared_with)
    return result


def delivered(
    response: Response,
    count: TokenCounter,
    baseline: str | None,
    compared_with: str,
    ids: TokenIds | None = None,
    origin: sequences.TokenOrigin | None = None,
) -> Continuity:
    """What a response that did not complete (an error, a cut) delivered before its end: the
    beginning of the text it owes, nothing repeated and nothing else; where its tokens name
    their worker, each run unbroken. A refused move owes no more, but no less true."""
    result = Continuity()
    if not response.text:
        return result
    told = told_runs(response, ids, origin)
    if told is not None:  # each run its worker's own: a text of another worker's is no guide
        result.problems += told.problems
        result.runs = told
    elif baseline is not None and not baseline.startswith(response.text):
        at = first_divergence(baseline, response.text)
        assert at is not None
        token = differing_token(baseline, response.text, at, count)
        where = f"token {token} (character {at})" if token is not None else f"character {at}"
        result.problems.append(
            f"the text delivered before the response ended departs from {compared_with} at "
            f"{where}: {baseline[at : at + 40]!r} expected, {response.text[at : at + 40]!r} "
            f"received"
        )
    return result


def settle_boundary(result: Continuity, compared_with: str) -> None:
    """A text token for token what a known context gives (`compared_with`): nothing the
    client read was lost or repeated at the migration, whatever the boundary's timing could
    not tell. Only where the boundary's place was in doubt: a move with no new worker found is
    not a question the text answers."""
    settled = [u for u in result.unproven if "tokens begin is ambiguous" in u]
    result.notes += [
        f"{unmade}; settled by the text: it equals {compared_with} token for token"
        for unmade in settled
    ]
    result.unproven = [u for u in result.unproven if u not in settled]


def served_problems(
    told: sequences.Runs | None, served: list[tuple[str, int]] | None, result: Continuity
) -> list[str]:
    """Whether each run of the response's tokens is a worker's that received the request, in
    order (`sequences.unserved`), where the tokens name their worker; not proven where the
    workers' numbers are not known for certain (`served` None)."""
    if told is None or not told.workers:
        return []
    if served is None:
        result.unproven.append(
            "whether each run of tokens is a worker's that received the request: the workers' "
            "numbers are not known for certain"
        )
        return []
    return sequences.unserved(told, served)


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


def request_id(response_id: str) -> str:
    """The request id the workers log for a response's `id` (chatcmpl-<uuid> -> <uuid>)."""
    return response_id.split("-", 1)[-1]


def takeover(logs: Mapping[str, Path], response_id: str) -> Takeover | None:
    """The worker among `logs` (name -> log file) that logged receiving the request last, and
    when, on the monotonic clock; None if none did. A worker logs the line before it generates,
    so once the client has read the whole response the line is written."""
    wanted = request_id(response_id)
    wall_minus_monotonic = time.time() - time.monotonic()
    seen = []
    for name, path in logs.items():
        for stamp, received_id in receipts(path):
            if received_id == wanted:
                wall = datetime.fromisoformat(stamp).timestamp()
                seen.append((wall - wall_minus_monotonic, name))
    if not seen:
        return None
    at, name = max(seen)
    return Takeover(name, at)


def boundary(
    times: list[float], fault_at: float, taken: Takeover, read: list[int], most: int
) -> Boundary:
    """The migration's pause in the client's reading of content frames (monotonic `times`;
    `read[i]` tokens read before frame i): the longest gap that ends after the new worker
    received the request (its frames cannot come sooner), at a frame with at most `most`
    tokens before it (the context's and `REPLAY_SPAN` more). A first frame read after the fault
    is measured from the fault. Certain only where the pause stands out from every other gap
    of the stream (`STANDS_OUT`) and is not followed by a burst."""

    def gap(i: int) -> float:
        return times[i] - (times[i - 1] if i else fault_at)

    start = max(taken.received_at, fault_at)
    after = [i for i, t in enumerate(times) if t > start and read[i] <= most]
    if not after:
        why = f"no frame read after {taken.worker} received it, within {most} tokens"
        return Boundary(len(times), False, why)
    pause = max(after, key=gap)
    where = f"the {gap(pause) * 1000:.1f} ms pause before frame {pause + 1}"
    others = [i for i in range(1, len(times)) if i != pause]
    if not others:
        return Boundary(pause, False, f"{where} is the only gap: no stall to tell it from")
    longest = max(others, key=gap)
    if gap(pause) < STANDS_OUT * gap(longest):
        why = (
            f"{where} is not {STANDS_OUT:g}x the longest other gap of the client's reading "
            f"({gap(longest) * 1000:.1f} ms, before frame {longest + 1}): a stall this run "
            f"shows could pass for it"
        )
        return Boundary(pause, False, why)
    step = sorted(gap(i) for i in others)[len(others) // 2]
    following = range(pause + 1, min(pause + 1 + BURST_LOOK, len(times)))
    if any(gap(i) < BURST_FRACTION * step for i in following):
        why = f"{where} is followed by frames read back to back: the client had fallen behind"
        return Boundary(pause, False, why)
    return Boundary(pause, True, f"{where}, after {taken.worker} received the request")


def too_few_carried(context: int, migration: Migration) -> list[str]:
    """A context shorter than the prompt, or, once the frontend counted a move, than the
    tokens it is known to have received before the fault (with no move, nothing was
    re-issued: the context is the prompt)."""
    prompt, least = migration.prompt_tokens, migration.carried_at_least
    carried = context - prompt
    if carried < 0:
        return [f"usage.prompt_tokens is {context}, below the {prompt} of the prompt"]
    if migration.moved and carried < least:
        return [
            f"the frontend had received {least} tokens from the faulted worker before the "
            f"fault, but the re-issued context carried {carried} (usage.prompt_tokens "
            f"{context} - prompt {prompt}): {least - carried} lost at the migration"
        ]
    return []


def context_problems(
    response: Response,
    max_tokens: int,
    count: TokenCounter,
    migration: Migration,
    result: Continuity,
    ids: TokenIds | None = None,
    told: sequences.Runs | None = None,
) -> list[str]:
    """The re-issued context against what the client had read before the new worker's first
    token: `usage.prompt_tokens` is the prompt plus the tokens the context carried. Where the
    check cannot be made for certain it is not proven (`result.unproven`), never passed."""
    context = (response.usage or {}).get("prompt_tokens")
    if context is None:
        return ["the response has no usage.prompt_tokens: the re-issued context is unknown"]
    prompt, taken = migration.prompt_tokens, migration.takeover
    carried = context - prompt
    if too_few := too_few_carried(context, migration):
        return too_few
    frames = [(c.at, count(c.text)) for c in response.chunks if c.text]
    if taken is None:
        return unclaimed(context, prompt, frames, migration, result)
    context_is = f"the re-issued context carried {carried} (usage.prompt_tokens {context} "
    context_is += f"- prompt {prompt})"
    if told is not None and len(told.lengths) > 1:  # certain: the tokens name their worker
        first = f"{taken.worker}'s first (the token where the worker that generated them changes)"
        before, total = sum(told.lengths[:-1]), sum(told.lengths)
        problems = compared(before, carried, max_tokens, total, first, context_is, result)
        if (record := held(response, migration, carried, ids)) is not None:
            problems += identity_problems(record, carried, max_tokens, total, taken, result)
        return problems
    return timed_context(response, max_tokens, migration, frames, context_is, result, ids)


def timed_context(
    response: Response,
    max_tokens: int,
    migration: Migration,
    frames: list[tuple[float, int | None]],
    context_is: str,
    result: Continuity,
    ids: TokenIds | None,
) -> list[str]:
    """`context_problems` where the tokens do not name their worker: what the client had read
    before the new worker could send (causality), the worker's own record of its context, or
    the pause before its first token (`boundary`)."""
    taken = migration.takeover
    assert taken is not None
    carried = (response.usage or {})["prompt_tokens"] - migration.prompt_tokens
    counts = [n for _, n in frames if n is not None]
    if len(frames) < 2 or len(counts) < len(frames):
        why = "the client read the response whole" if len(frames) < 2 else "tokens not counted"
        result.notes.append(
            f"the re-issued context (the prompt plus {carried} tokens) not compared with what "
            f"the client had when {taken.worker} took over: {why}"
        )
        return []
    start_at, start = could_start(taken, migration)
    early = sum(n for (t, _), n in zip(frames, counts, strict=True) if t < start_at)
    if early > carried:  # certain: the new worker could not have sent a token yet
        return [
            f"the client had read {early} tokens before {start}, but {context_is}: "
            f"{early - carried} replayed at the migration"
        ]
    if (record := held(response, migration, carried, ids)) is not None:
        return identity_problems(record, carried, max_tokens, sum(counts), taken, result)
    if early == carried:  # certain: the client had every token of the context by then
        result.notes.append(
            f"the re-issued context is the prompt plus exactly the {carried} tokens the client "
            f"read before {start} (causality)"
        )
        return []
    read = list(accumulate(counts, initial=0))[:-1]
    edge = boundary([t for t, _ in frames], migration.fault_at, taken, read, carried + REPLAY_SPAN)
    if not edge.certain:
        result.unproven.append(
            f"whether a token was lost at the migration: where {taken.worker}'s tokens begin "
            f"is ambiguous ({edge.why}), and no record of its context says it; checked only "
            f"that the context holds the {early} tokens the client read before {start}"
        )
        return []
    first = f"{taken.worker}'s first ({edge.why})"
    before = sum(counts[: edge.index])
    return compared(before, carried, max_tokens, sum(counts), first, context_is, result)


def told_runs(
    response: Response, ids: TokenIds | None, origin: sequences.TokenOrigin | None
) -> sequences.Runs | None:
    """The runs of each worker's tokens in the response, where its tokens name their worker."""
    if ids is None or origin is None or (read := ids(response.text)) is None:
        return None
    return sequences.runs(read, origin)


def could_start(taken: Takeover, migration: Migration) -> tuple[float, str]:
    """The earliest the new worker's first token can reach the client, and why: once it has
    received the re-issued request, and not before the least time a first token takes after
    the fault, where the backend knows one. Every token the client read sooner is one of the
    faulted worker's: as many as the context carried, none was lost."""
    floor = migration.first_token_floor_s
    if floor is not None and migration.fault_at + floor > taken.received_at:
        why = f"the re-issued request's KV transfer takes at least {floor:.2f} s after the fault"
        return migration.fault_at + floor, f"{taken.worker} could send its first token ({why})"
    return taken.received_at, f"{taken.worker} received the re-issued request"


def compared(
    before: int,
    carried: int,
    max_tokens: int,
    total: int,
    first: str,
    context_is: str,
    result: Continuity,
) -> list[str]:
    """The tokens the client read before the new worker's `first` token against the `carried`
    ones: more are replayed, fewer lost; equal, a note says so."""
    if before > carried:
        return [
            f"the client read {before} tokens before {first}, but {context_is}: "
            f"{before - carried} replayed at the migration"
        ]
    if before < carried:
        also = ", and as many repeated after it" if total == max_tokens else ""
        return [
            f"the client read {before} tokens before {first}, but {context_is}: "
            f"{carried - before} lost at the migration{also}"
        ]
    result.notes.append(
        f"the re-issued context is the prompt plus exactly the {before} tokens the client read "
        f"before {first}"
    )
    return []


def unclaimed(
    context: int,
    prompt: int,
    frames: list[tuple[float, int | None]],
    migration: Migration,
    result: Continuity,
) -> list[str]:
    """No worker but the faulted one logged receiving the request. A context that grew, or a
    move counted when the client already had tokens that the context lacks (the request
    restarted from the bare prompt), is a failure; a move counted with nothing to tell it by
    is not proven; no move counted, there was no re-issued context to check."""
    carried = context - prompt
    if carried:
        return [
            f"usage.prompt_tokens is {context}, the prompt's {prompt} plus {carried}, but no "
            f"worker but the faulted one logged receiving the request"
        ]
    if not migration.moved:
        result.notes.append("no migration counted: the request's context was never re-issued")
        return []
    read = [n for t, n in frames if t < migration.fault_at]
    if None not in read and sum(read) > 0:
        return [
            f"the client had read {sum(read)} tokens when the fault was sent and the frontend "
            f"counted a move, but the re-issued context carried none (usage.prompt_tokens "
            f"{context} = the prompt): the request restarted from the bare prompt, its "
            f"{sum(read)} tokens lost from the context"
        ]
    result.unproven.append(
        "the re-issued context: the frontend counted a move, but no worker of the faulted "
        "role but the faulted one logged receiving the request (the successor's log line was "
        "not found), so where its tokens begin is unknown"
    )
    return []


def held(
    response: Response, migration: Migration, carried: int, ids: TokenIds | None
) -> tuple[list[int], list[int]] | None:
    """(the token ids the client read, the first `carried` ids of the new worker's own record
    of its context), where both are known and the record reaches that far; else None."""
    if migration.received is None or ids is None or len(migration.received) < carried:
        return None
    read: list[int] = []
    for chunk in response.chunks:
        if chunk.text:
            if (found := ids(chunk.text)) is None:
                return None
            read += found
    return read, migration.received[:carried]


def identity_problems(
    record: tuple[list[int], list[int]],
    carried: int,
    max_tokens: int,
    total: int,
    taken: Takeover,
    result: Continuity,
) -> list[str]:
    """The client's first `carried` tokens against the context the new worker received, token
    for token: equal, no token was lost or replaced before the migration, and the boundary is
    certain (a token the client read after them that the context lacks is caught by causality
    when read before the takeover, else by the count); different, the first differing token
    is named, with what a shift of the stream there explains."""
    read, context = record
    source = f"{taken.worker}'s own record of the context it received"
    if read[:carried] == context:
        result.notes.append(
            f"the re-issued context is the prompt plus exactly the {carried} tokens the client "
            f"read first, token for token ({source})"
        )
        return []
    at = next(i for i in range(carried) if i >= len(read) or read[i] != context[i])
    seen = f"token id {read[at]}" if at < len(read) else "nothing"
    what = shift_at(read, context, at)
    also = (
        ", and as many repeated after it" if what.endswith("lost") and total == max_tokens else ""
    )
    return [
        f"the client's token {at + 1} is {seen}, but the re-issued context's token {at + 1} is "
        f"token id {context[at]} ({source}): {what} at the migration{also}"
    ]


def shift_at(read: list[int], context: list[int], at: int, most: int = 4) -> str:
    """What the client's stream did at `at`, where it first departs from the context: `n lost`
    when it goes on as the context does `n` tokens later, `n replayed` when the context goes
    on as the stream does `n` tokens later; else that it departs."""
    for n in range(1, most + 1):
        if read[at : len(context) - n] == context[at + n :]:
            return f"{n} lost"
        if read[at + n : len(context)] == context[at : len(context) - n]:
            return f"{n} replayed"
    return "a token replaced"
