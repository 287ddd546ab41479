"""Requests sized to the engine's pace on this machine, measured when the case runs. Machines
of one kind differ by 2x and more, and an engine on CPUs differs most: an output length tuned
on one machine streams five times longer on another, past its case's deadline. So a backend
whose pace depends on the machine names how long a case's output should stream
(`Backend.output_seconds`); short streamed warm-up requests measure the tokens a second, the
case's request gets that many seconds of tokens, and the response must end within a bound
derived from the same rate, or the case fails as hung."""

from __future__ import annotations

from dataclasses import dataclass, replace

from handoff import client
from handoff.backend import Shape
from handoff.client import Request, Response
from handoff.errors import CaseFailure
from handoff.history import History
from handoff.machine.polling import Deadline

#: The warm-up's output: enough steps to time the decode, few enough to cost a second or two.
WARMUP_TOKENS = 48
#: The least output a sized request keeps: frames to prove it in flight, and a remainder.
FLOOR_TOKENS = 64
#: The response is given this many times its own streaming time...
SLOWER_BY = 4.0
#: ... plus this, for what does not scale with the output: the fault, the migration's
#: re-prefill of the context, the graceful bound.
FIXED_S = 30.0


@dataclass(frozen=True)
class Pace:
    """Output tokens a second, as the client read them from the warm-up streams: the slowest
    and the fastest of them."""

    slowest: float
    fastest: float

    def tokens_for(self, seconds: float) -> int:
        """Tokens that stream for at least `seconds`, even at the fastest pace seen."""
        return round(self.fastest * seconds)

    def seconds_for(self, tokens: int) -> float:
        """How long `tokens` take at worst, at the slowest pace seen."""
        return tokens / self.slowest


def measure_pace(
    base_url: str, request: Request, workers: int, deadline: Deadline, history: History
) -> Pace:
    """Stream `request` cut to WARMUP_TOKENS once for each of the deployment's `workers`, so
    that the router's round robin gives every worker a request before the case's (a worker's
    first request pays for its start: a slow first token, a KV transfer's handshake), and time
    each decode from its first content frame to its last. Each sending is in the history
    (`warmup_sent`): a KV transfer counter times its lag by them (`responses.transfers`)."""
    warmup = replace(request, stream=True, max_tokens=WARMUP_TOKENS)
    rates = []
    for _ in range(workers):
        response = Response()
        history.record("warmup_sent")
        client.send(base_url, warmup, response, read_timeout_s=deadline.remaining())
        frames = [chunk.at for chunk in response.chunks if chunk.text]
        if response.status != 200 or response.error or response.exception or len(frames) < 2:
            raise CaseFailure(
                f"the warm-up request that times the engine failed: {response.summary()}"
            )
        tokens = response.completion_tokens or len(frames)
        rates.append((tokens - 1) / max(frames[-1] - frames[0], 1e-3))
    return Pace(min(rates), max(rates))


def paced(
    base_url: str,
    request: Request,
    workers: int,
    seconds: float,
    shape: Shape,
    deadline: Deadline,
    history: History,
) -> tuple[Pace, Shape]:
    """The pace measured with warm-ups of `request` (`measure_pace`), and `shape` sized to
    `seconds` of output at it (`sized_to`); both recorded."""
    pace = measure_pace(base_url, request, workers, deadline, history)
    shape = sized_to(pace, seconds, shape)
    history.record(
        "paced",
        slowest_tokens_per_s=round(pace.slowest, 1),
        fastest_tokens_per_s=round(pace.fastest, 1),
        max_tokens=shape.max_tokens,
    )
    return pace, shape


def sized_to(pace: Pace, seconds: float, shape: Shape) -> Shape:
    """`shape` with `seconds` of output at `pace`: its own max_tokens at most (what the
    context leaves, or what the backend found enough), FLOOR_TOKENS at least."""
    wanted = pace.tokens_for(seconds)
    tokens = max(min(FLOOR_TOKENS, shape.max_tokens), min(wanted, shape.max_tokens))
    return replace(shape, max_tokens=tokens)


def response_bound_s(shape: Shape, pace: Pace) -> float:
    """How long after it was sent the response must have ended, at the measured pace."""
    return SLOWER_BY * pace.seconds_for(shape.max_tokens) + FIXED_S
