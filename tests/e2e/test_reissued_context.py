"""The re-issued context, end to end on the mocker: a real migrated stream, altered on its way
to the client by a loopback proxy the way a frontend that replays or loses a token at the
migration would alter it, with the token count kept at max_tokens. Each alteration must fail
the case for its own reason; the same stream unaltered passes.

The case's SIGKILL comes from a still stream, so that where the alteration sits is known, not
guessed from timing: the proxy alters the next frame while the holder still runs, the holder is
then stopped (SIGSTOP), and the kill goes out once the client has read every frame there was
and the frontend has sent none for `STILL_S`. A replay is then read before the new worker
received the request, which the verdict proves by causality; a loss is told by the pause before
the new worker's first frame, which then stands out from any stall of a loaded machine. The
mocker decodes slower than its default (`SlowMocker`) so that the frontend's own hiccups under
load seldom send the new worker's first frames together (the verdict cannot tell that from a
client that fell behind, and rightly calls the boundary ambiguous), and the proxy spreads out
those that still come together (seen at -n 6 on 2 cores)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from altering_proxy import AlteringProxy

from handoff import client, faults, runner
from handoff.backend import Shape
from handoff.cases import Case
from handoff.polling import poll_until
from handoff.responses import single
from handoff.runner import Settings
from handoff_mocker import MockerBackend

CASE = "migration_enabled-worker_failure-chat-stream-tcp"
#: How long the stopped holder's stream must have been still before the kill: longer than the
#: stalls of a frontend and a client on a loaded machine.
STILL_S = 0.3
#: The mocker's speed here: a decode step (75 ms) longer than a loaded frontend's usual hiccup.
SPEEDUP_RATIO = 0.1
#: Enough tokens for the in-flight proof, the frames before the stop and some after the kill,
#: at the slower speed.
MAX_TOKENS = 48


class SlowMocker(MockerBackend):
    """The mocker decoding at `SPEEDUP_RATIO`, with a request of `MAX_TOKENS`."""

    def __init__(self) -> None:
        super().__init__(speedup_ratio=SPEEDUP_RATIO)

    def shape(self, case: Case, variant: int = 0) -> Shape:
        return replace(super().shape(case, variant), max_tokens=MAX_TOKENS)


@pytest.fixture
def proxied(monkeypatch, tmp_path: Path):
    """Send the case's request through an AlteringProxy in the mode asked, and make the case's
    fault from a still stream (the module's docstring); yields a function that runs the case and
    returns its result and the proxy."""
    proxies: list[AlteringProxy] = []
    mode: list[str | None] = [None]
    inject = faults.inject

    def through_proxy(base_url, request, read_timeout_s):
        proxies.append(AlteringProxy(base_url, mode[0]))
        return client.InFlight(proxies[-1].url, request, read_timeout_s)

    def from_a_still_stream(fault, holder, inflight, graceful_bound_s, deadline, broker=None):
        proxy = proxies[-1]
        proxy.alter()
        holder.process.freeze(deadline)

        def still() -> tuple[bool | None, str]:
            status = proxy.status()
            read, forwarded = inflight.response.content_chunks, status["forwarded"]
            quiet = time.monotonic() - status["last_content_at"]
            seen = f"the client read {read} of {forwarded} content frames, {quiet:.3f} s quiet"
            return (True if read == forwarded and quiet >= STILL_S else None), seen

        poll_until(still, deadline, "the stopped holder's stream to be still")
        proxy.migrating()
        return inject(fault, holder, inflight, graceful_bound_s, deadline, broker)

    monkeypatch.setattr(single, "InFlight", through_proxy)
    monkeypatch.setattr(faults, "inject", from_a_still_stream)

    def run(how: str | None):
        mode[0] = how
        result = runner.run_case(
            SlowMocker(), Case.from_id(CASE), tmp_path, Settings(keep_logs=True), 60
        )
        return result, proxies[-1]

    yield run
    for proxy in proxies:
        proxy.close()


def context_event(result):
    return next(e.data for e in result.history.events if e.name == "continuity_checked")


def test_the_unaltered_stream_through_the_proxy_passes_with_a_certain_boundary(proxied):
    result, proxy = proxied(None)
    assert result.verdict.passed, result.verdict.reasons
    assert proxy.altered() == []
    assert any(
        "the re-issued context is the prompt plus exactly the" in n for n in result.verdict.notes
    ), result.verdict.notes


@pytest.mark.parametrize(
    ("mode", "altered", "reason", "proof"),
    [
        (
            "replay",
            [("replayed", 1), ("dropped_final", 1)],
            "1 replayed at the migration",
            "received the re-issued request, but the re-issued context carried",  # causality
        ),
        (
            "lost_and_repeated",
            [("lost", 1), ("repeated", 3)],
            "1 lost at the migration, and as many repeated after it",
            "after worker-",  # the boundary: the pause after the new worker received it
        ),
    ],
)
def test_a_token_replayed_or_lost_at_the_migration_fails_with_the_count_unchanged(
    proxied, mode, altered, reason, proof
):
    result, proxy = proxied(mode)
    assert proxy.altered() == altered
    # A pass says why: the boundary's note, and the folder whose history.json has the times.
    assert not result.verdict.passed, (result.verdict.notes, result.folder)
    # The count, usage and one token per frame all still agree: only the context tells.
    assert len(result.verdict.reasons) == 1, result.verdict.reasons
    (found,) = result.verdict.reasons
    assert reason in found and proof in found, found
    assert "the re-issued context carried" in found
    assert context_event(result)["problems"] == [found]
