"""The re-issued context, end to end on the mocker: a real migrated stream, altered on its way
to the client by a loopback proxy the way a frontend that replays or loses a token at the
migration would alter it, with the token count kept at max_tokens. Each alteration must fail
the case for its own reason; the same stream unaltered passes; a stream whose boundary is
really ambiguous, with no record to settle it, is not proven.

The case's SIGKILL comes from a still stream, so that where the alteration sits is known, not
guessed from timing (altering_proxy.through_proxy): the proxy alters the next frame while the
holder still runs, the holder is then stopped (SIGSTOP), and the kill goes out once the client
has read every frame there was and the frontend has sent none for a while. A replay is then
read before the new worker received the request, which the verdict proves by causality; a loss
is told by the new worker's own record of the context it received (the mocker's KV blocks),
or, where there is none (`NoRecordMocker`), by the pause before the new worker's first frame,
which then stands out from any stall of a loaded machine. The mocker decodes slower than its
default (`SlowMocker`) so that the frontend's own hiccups under load seldom send the new
worker's first frames together (the verdict cannot tell that from a client that fell behind,
and rightly calls the boundary ambiguous), and the proxy spreads out those that still come
together (seen at -n 6 and 8 on 2 cores); its `burst` mode sends them together on purpose."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from altering_proxy import AlteringProxy, through_proxy

from handoff import runner
from handoff.backend import Shape
from handoff.cases import Case
from handoff.client import Annotations
from handoff.runner import Settings
from handoff.verdict import NOT_PROVEN, PASSED
from handoff_mocker import MockerBackend, origins

CASE = "migration_enabled-worker_failure-chat-stream-tcp"
#: The mocker's speed here: a decode step (75 ms) longer than a loaded frontend's usual hiccup.
SPEEDUP_RATIO = 0.1
#: Enough tokens for the in-flight proof, the frames before the stop and some after the kill,
#: at the slower speed.
MAX_TOKENS = 48


class SlowMocker(MockerBackend):
    """The mocker decoding at `SPEEDUP_RATIO`, with a request of `MAX_TOKENS`, its workers
    keeping the record of the context they received (`kv_record`; its ports bind every
    address, so only these tests turn it on) and drawing their tokens at random, which do not
    name their worker (handoff_mocker.origins)."""

    def __init__(self, kv_record: bool = True) -> None:
        super().__init__(speedup_ratio=SPEEDUP_RATIO, kv_record=kv_record)

    def shape(self, case: Case, variant: int = 0) -> Shape:
        return replace(super().shape(case, variant), max_tokens=MAX_TOKENS, annotations=None)

    def replays(self, case: Case) -> bool:
        return False


class NoRecordMocker(SlowMocker):
    """The slowed mocker with no record of the context its workers received, as the mocker
    runs by default and as an engine that keeps none: the boundary is told by timing alone."""

    def __init__(self) -> None:
        super().__init__(kv_record=False)


@pytest.fixture
def proxied(monkeypatch, tmp_path: Path):
    """Send the case's request through an AlteringProxy in the mode asked, and make the case's
    fault from a still stream (altering_proxy.through_proxy); yields a function that runs the
    case on a backend and returns its result and the proxy."""
    started: list[list[AlteringProxy]] = []

    def run(how: str | None, backend: SlowMocker | None = None):
        started.append(through_proxy(monkeypatch, how))
        result = runner.run_case(
            backend or SlowMocker(), Case.from_id(CASE), tmp_path, Settings(keep_logs=True), 60
        )
        return result, started[-1][-1]

    yield run
    for proxies in started:
        for proxy in proxies:
            proxy.close()


def context_event(result):
    return next(e.data for e in result.history.events if e.name == "continuity_checked")


@pytest.mark.parametrize(
    ("backend", "proof"),
    [
        (SlowMocker, "tokens the client read first, token for token (worker-"),
        # Every frame of the stopped holder was read before the new worker had the request.
        (NoRecordMocker, "received the re-issued request (causality)"),
    ],
)
def test_the_unaltered_stream_through_the_proxy_passes_with_a_certain_boundary(
    proxied, backend, proof
):
    result, proxy = proxied(None, backend())
    assert result.verdict.outcome == PASSED, result.verdict.summary()
    assert proxy.altered() == []
    notes = [n for n in result.verdict.notes if "the re-issued context is the prompt plus" in n]
    assert len(notes) == 1 and proof in notes[0], result.verdict.notes


@pytest.mark.parametrize(
    ("mode", "backend", "altered", "reason", "proof"),
    [
        (
            "replay",
            SlowMocker,
            [("replayed", 1), ("dropped_final", 1)],
            "1 replayed at the migration",
            "received the re-issued request, but the re-issued context carried",  # causality
        ),
        (
            "lost_and_repeated",
            SlowMocker,
            [("lost", 1), ("repeated", 3)],
            "1 lost at the migration, and as many repeated after it",
            "own record of the context it received",  # the new worker's KV blocks
        ),
        (
            "lost_and_repeated",
            NoRecordMocker,
            [("lost", 1), ("repeated", 3)],
            "1 lost at the migration, and as many repeated after it",
            "after worker-",  # the boundary: the pause after the new worker received it
        ),
    ],
)
def test_a_token_replayed_or_lost_at_the_migration_fails_with_the_count_unchanged(
    proxied, mode, backend, altered, reason, proof
):
    result, proxy = proxied(mode, backend())
    assert proxy.altered() == altered
    # A pass says why: the boundary's note, and the folder whose history.json has the times.
    assert not result.verdict.passed, (result.verdict.notes, result.folder)
    # The count, usage and one token per frame all still agree: only the context tells.
    assert len(result.verdict.reasons) == 1, result.verdict.reasons
    (found,) = result.verdict.reasons
    assert reason in found and proof in found, found
    assert "the re-issued context" in found
    assert context_event(result)["problems"] == [found]


def assert_burst(altered: list[tuple[str, int]]) -> None:
    """The faulted worker's frames held from the armed one on (more than one where a loaded
    machine let it send more before it was stopped), then sent with the new worker's first."""
    held = altered[:-1]
    assert held and held == [("held", 1)] * len(held), altered
    assert altered[-1] == ("sent_together", len(held) + 1), altered


def test_a_boundary_really_ambiguous_with_no_record_is_not_proven(proxied):
    """The faulted worker's last frame held back and sent with the new worker's first, back to
    back, as a client that fell behind reads them: it is read after the new worker received
    the request, and whether it is the faulted worker's (nothing lost) or the new worker's (one
    lost) cannot be told. Not a pass and not a failure: not proven, with why, logs kept."""
    result, proxy = proxied("burst", NoRecordMocker())
    assert_burst(proxy.altered())
    verdict = result.verdict
    assert verdict.outcome == NOT_PROVEN and not verdict.passed, verdict.summary()
    assert verdict.reasons == []
    (unmade,) = verdict.unproven
    assert "is followed by frames read back to back: the client had fallen behind" in unmade
    assert context_event(result)["unproven"] == [unmade]
    assert verdict.summary() == f"NOT PROVEN: {unmade}"
    assert (result.folder / "frontend.log").is_file()  # kept, as a failure's


def test_the_new_workers_record_settles_a_boundary_that_timing_cannot(proxied):
    result, proxy = proxied("burst", SlowMocker())
    assert_burst(proxy.altered())
    assert result.verdict.outcome == PASSED, result.verdict.summary()
    assert any("token for token" in n for n in result.verdict.notes), result.verdict.notes


class NamingMocker(SlowMocker):
    """The slowed mocker whose workers each replay an output of their own
    (handoff_mocker.origins), as the mocker runs by default: every token names its worker, so
    where the new worker's tokens begin is told by the tokens, whatever the timing."""

    def __init__(self) -> None:
        super().__init__(kv_record=False)

    def shape(self, case: Case, variant: int = 0) -> Shape:
        shape = super().shape(case, variant)
        return replace(shape, annotations=Annotations((origins.ANNOTATION,), shape.max_tokens))

    def replays(self, case: Case) -> bool:
        return True


@pytest.mark.parametrize(
    ("mode", "reasons"),
    [
        (None, []),
        ("burst", []),  # the boundary timing cannot tell: the tokens tell it
        (
            "replay",
            [
                "after its token", "1 of its tokens repeated",
                "'s first (the token where the worker that generated them changes), but the "
                "re-issued context carried", "1 replayed at the migration",
            ],
        ),
        (  # the count, usage and frames all still agree: only the token's origin tells
            "drawn",
            ["1 token(s) name no worker, the first token", "(id 1500): replaced, or generated"],
        ),
        (  # every run whole and the context exact: only whose tokens they are tells
            "crossed",
            ["the response's tokens came from workers #", "in turn; only worker-"],
        ),
        (
            "lost_and_repeated",
            [
                "'s token 3 (modulo 256), after its token 3: 1 of its tokens repeated",
                "1 lost at the migration, and as many repeated after it",
            ],
        ),
    ],
)  # fmt: skip
def test_tokens_that_name_their_worker_tell_the_boundary_and_every_break(proxied, mode, reasons):
    result, proxy = proxied(mode, NamingMocker())
    assert bool(proxy.altered()) == (mode is not None), proxy.altered()
    verdict = result.verdict
    told = [n for n in verdict.notes if "each token names the worker" in n]
    assert mode == "drawn" or (told and "2 run(s)" in told[0]), (verdict.notes, result.folder)
    found = " | ".join(verdict.reasons)
    assert verdict.passed == (not reasons) and verdict.unproven == [], verdict.summary()
    assert all(r in found for r in reasons), found
