"""The re-issued context, end to end on the mocker: a real migrated stream, altered on its way
to the client by a loopback proxy the way a frontend that replays or loses a token at the
migration would alter it, with the token count kept at max_tokens. Each alteration must fail
the case for its own reason; the same stream unaltered passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from altering_proxy import AlteringProxy

from handoff import client, runner
from handoff.cases import Case
from handoff.runner import Settings
from handoff_mocker import MockerBackend

CASE = "migration_enabled-worker_failure-chat-stream-tcp"


def taken_over(folder: Path) -> bool:
    """Whether a second worker of the case has logged receiving a request: the faulted worker
    logs the case's one request, the worker it migrates to logs it again."""
    logs = folder.glob("worker-*.log")
    return sum(p.read_text(errors="replace").count("request received") for p in logs) >= 2


@pytest.fixture
def proxied(monkeypatch, tmp_path):
    """Send the case's request through an AlteringProxy; yields a function that sets its mode
    and returns the proxy, once the case has started it."""
    proxies: list[AlteringProxy] = []
    mode: list[str | None] = [None]

    def through_proxy(base_url, request, read_timeout_s):
        proxy = AlteringProxy(base_url, mode[0], lambda: taken_over(tmp_path))
        proxies.append(proxy)
        return client.InFlight(proxy.url, request, read_timeout_s)

    monkeypatch.setattr(runner, "InFlight", through_proxy)

    def run(how: str | None):
        mode[0] = how
        result = runner.run_case(
            MockerBackend(), Case.from_id(CASE), tmp_path, Settings(keep_logs=True), 60
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
    assert proxy.altered == []
    assert any(
        "the re-issued context is the prompt plus exactly the" in n for n in result.verdict.notes
    ), result.verdict.notes


@pytest.mark.parametrize(
    ("mode", "altered", "reason"),
    [
        ("replay", [("replayed", 1), ("dropped_final", 1)], "1 replayed at the migration"),
        (
            "lost_and_repeated",
            [("lost", 1), ("repeated", 3)],
            "1 lost at the migration, and as many repeated after it",
        ),
    ],
)
def test_a_token_replayed_or_lost_at_the_migration_fails_with_the_count_unchanged(
    proxied, mode, altered, reason
):
    result, proxy = proxied(mode)
    assert proxy.altered == altered
    assert not result.verdict.passed
    # The count, usage and one token per frame all still agree: only the context tells.
    assert len(result.verdict.reasons) == 1, result.verdict.reasons
    (found,) = result.verdict.reasons
    assert reason in found
    assert "the re-issued context carried" in found
    assert context_event(result)["problems"] == [found]
