"""Which worker generated each token of a response, where the tokens themselves say it
(`Backend.token_origin`: the mocker's replayed outputs).

A response is then runs of tokens, one a worker, in the order the workers held the request; a
run begins where the worker changes, or where a worker's output starts over at its first
token. Each run must be its worker's own output from its first token on, with nothing lost or
repeated in between: a break names the token and what went missing or came twice, wherever it
sits, not only at a migration. The last run is the last new worker's, so every token the client
read before it is what the frontend re-issued to that worker: the move's boundary, certain
whatever the client's timing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Origin:
    """A token's worker (a number of the backend's, not a process name), its place in that
    worker's own output, counted from 0, and the length after which that output repeats."""

    worker: int
    place: int
    period: int


TokenOrigin = Callable[[int], Origin | None]


@dataclass
class Runs:
    #: How many tokens each worker gave in turn.
    lengths: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def runs(ids: list[int], origin: TokenOrigin) -> Runs | None:
    """The runs of `ids` (a response's token ids, in order); None where a token names no worker,
    or there are none."""
    found = [origin(token) for token in ids]
    if not found or None in found:
        return None
    told = Runs()
    last: Origin | None = None
    for at, now in enumerate(found):
        assert now is not None
        due = None if last is None else (last.place + 1) % now.period
        if last is not None and now.worker == last.worker and now.place == due:
            told.lengths[-1] += 1
        elif last is None or now.worker != last.worker or now.place == 0:
            told.lengths.append(1)
            if now.place:
                told.problems.append(
                    f"token {at + 1} is the first of worker #{now.worker}'s in the response, but "
                    f"its token {now.place + 1}: the {now.place} before it lost"
                )
        else:
            told.lengths[-1] += 1
            told.problems.append(break_in(at, last, now))
        last = now
    return told


def break_in(at: int, last: Origin, now: Origin) -> str:
    """What a worker's output did between two of its tokens that do not follow each other."""
    gap = (now.place - last.place - 1) % now.period
    what = (
        f"{gap} of its tokens lost"
        if gap < now.period // 2
        else f"{now.period - gap} of its tokens repeated"
    )
    return (
        f"token {at + 1} is worker #{now.worker}'s token {now.place + 1} (modulo {now.period}), "
        f"after its token {last.place + 1}: {what}"
    )
