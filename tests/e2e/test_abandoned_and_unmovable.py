"""A request that must not move and a client that leaves, made to go wrong for real: a guided
request whose guide the frontend cannot see is moved; a worker that ignores its client's going,
and one whose engine goes on with the request, fail the case by their names; and a frontend
that never hears its client leave (a proxy between them holds the frontend's stream open)
moves a stalled request for nobody and counts no close."""

import signal
from dataclasses import replace

import pytest
from altering_proxy import AlteringProxy
from misbehaving import HeldEngineGauge

from handoff import faults, runner
from handoff.cases import Case
from handoff.client import InFlight
from handoff.responses import abandon, recovery
from handoff.runner import Settings
from handoff_mocker import MockerBackend

SETTINGS = Settings(keep_logs=True)


class HiddenGuideMocker(MockerBackend):
    """Its guide is the worker's own, not sent (the mocker ignores guides anyway): the frontend
    takes the request for one it may move, as a frontend without Dynamo's fix 7930 would take
    a guided one."""

    def guide(self, api):
        return replace(super().guide(api), hidden=True)


def test_a_guided_request_the_frontend_cannot_see_is_moved_and_fails_the_case(tmp_path):
    case = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp", "guided")
    result = runner.run_case(HiddenGuideMocker(), case, tmp_path, SETTINGS, timeout_s=60)
    assert not result.verdict.passed
    reasons = " | ".join(result.verdict.reasons)
    assert "requires an API error after the fault, but the response ended without one" in reasons
    assert "migration counter succeeded = 1, expected 0" in reasons
    assert "migration counter failed = 0, expected 1" in reasons
    # The same request with its guide in sight is refused the move: the case passes.
    seen = runner.run_case(MockerBackend(), case, tmp_path / "seen", SETTINGS, timeout_s=60)
    assert not seen.verdict.reasons, seen.verdict.summary()


def test_a_worker_that_ignores_its_clients_going_fails_the_case_by_name(tmp_path, monkeypatch):
    """The worker holding the request is stopped (SIGSTOP of its tree) the moment its client
    hangs up: it never stops the request, and its gauge never answers."""
    holders = []
    find_holder, close = faults.find_holder, InFlight.close

    def found(*args):
        holders.append(find_holder(*args))
        return holders[-1]

    def hang_up_on_a_stopped_worker(inflight):
        holders[-1].process.signal_tree(signal.SIGSTOP)
        return close(inflight)

    monkeypatch.setattr(faults, "find_holder", found)
    monkeypatch.setattr(InFlight, "close", hang_up_on_a_stopped_worker)
    case = Case.from_id("client_close-chat-tcp", "abandoned")
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, timeout_s=60)
    assert not result.verdict.passed and holders
    reasons = " | ".join(result.verdict.reasons)
    stopped = holders[-1].name
    assert f"{stopped} went on with the request after its client left" in reasons
    assert f"timed out waiting for {stopped} to stop the request" in reasons


class EngineGoesOnMocker(HeldEngineGauge, MockerBackend):
    """Its engine's running gauge stays up once it ran the request (held_engine_gauge.py)."""


def test_a_worker_whose_engine_goes_on_with_the_request_fails_the_case_by_name(tmp_path):
    """The handler lets the request go (its in-flight gauge falls to 0, its log says why, its
    counters agree); the engine's own gauge still says it runs it."""
    case = Case.from_id("client_close-chat-tcp", "abandoned")
    result = runner.run_case(EngineGoesOnMocker(), case, tmp_path, SETTINGS, timeout_s=60)
    assert not result.verdict.passed
    # The abandon check names it; the idle check, which reads the engine too, says it again.
    reason, idle = result.verdict.reasons
    holder = next(e.data["worker"] for e in result.history.events if e.name == "holder_found")
    assert idle.startswith("after every response ended: ") and f"{holder}'s engine" in idle, idle
    assert reason.startswith(f"{holder} went on with the request after its client left: "), reason
    assert reason.endswith(
        f"last seen: 0 in flight by its handler, 1 running in its engine "
        f"({MockerBackend.engine_running_gauge})"
    ), reason


class NoSuchEngineGauge(MockerBackend):
    """Names an engine gauge its workers do not export."""

    engine_running_gauge = "vllm:no_such_gauge"


def test_an_engine_gauge_the_workers_do_not_export_is_unknown_and_fails_the_case(tmp_path):
    case = Case.from_id("client_close-chat-tcp", "abandoned")
    result = runner.run_case(NoSuchEngineGauge(), case, tmp_path, SETTINGS, timeout_s=60)
    assert not result.verdict.passed
    reason, idle = result.verdict.reasons
    assert "exports no vllm:no_such_gauge" in idle, idle
    assert "went on with the request after its client left" in reason
    assert "(port " in reason and ": exports no vllm:no_such_gauge)" in reason, reason


@pytest.fixture
def unheard(monkeypatch):
    """The case's client talks to the frontend through an AlteringProxy in mode
    "unheard_close": its hanging up never reaches the frontend. Yields the proxies started."""
    proxies: list[AlteringProxy] = []

    def through_proxy(base_url, request, read_timeout_s):
        proxies.append(AlteringProxy(base_url, "unheard_close"))
        return InFlight(proxies[-1].url, request, read_timeout_s)

    monkeypatch.setattr(abandon, "InFlight", through_proxy)
    yield proxies
    for proxy in proxies:
        proxy.close()


def unheard_close_reasons(result) -> str:
    """The reasons, once checked to fail for the close the frontend never counted."""
    assert not result.verdict.passed
    reasons = " | ".join(result.verdict.reasons)
    for name, _ in abandon.CLOSE_COUNTERS:
        assert f"the frontend's {name} rose by 0, expected 1" in reasons, reasons
    return reasons


def test_a_stalled_request_whose_close_the_frontend_never_hears_is_moved_and_fails(
    unheard, tmp_path
):
    """The frontend, with the stream timeout of the stall cases, moves the stopped worker's
    request when the timeout fires: nobody told it the client had gone."""
    case = Case.from_id("close_in_stall-chat-tcp", "abandoned")
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, timeout_s=90)
    assert unheard, result.verdict.summary()  # the request was sent, through the proxy
    reasons = unheard_close_reasons(result)
    events = {e.name: e for e in result.history.events}
    timeout = events["launch"].data["frontend_env"]["DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS"]
    assert timeout == str(SETTINGS.stream_timeout_s)
    moved = events["migration_seen"]
    assert moved.data["ongoing_request"] == 1, moved.data
    assert moved.at >= events["client_closed"].at + SETTINGS.stream_timeout_s - 1
    assert "the frontend moved a request whose client had left (" in reasons
    assert "migration counter ongoing_request = 1, expected 0" in reasons


@pytest.mark.parametrize("lifecycle", ["client_close-chat-tcp", "close_after_move-completion-tcp"])
def test_a_close_the_frontend_never_hears_fails_the_case(unheard, tmp_path, lifecycle):
    """The worker streams the request to its end for nobody, and says so: no cancellation."""
    case = Case.from_id(lifecycle, "abandoned")
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, timeout_s=90)
    assert unheard, result.verdict.summary()  # the request was sent, through the proxy
    reasons = unheard_close_reasons(result)
    assert f"without logging {abandon.CANCELLED!r} or {abandon.UNSENT!r}" in reasons


def test_a_stall_whose_close_is_never_counted_leaves_the_window_unknown_and_fails(
    unheard, tmp_path
):
    """The frontend neither hears the close nor has a stream timeout: nothing moves, but
    nothing measured says how long a move would take to show, so no move is no proof."""
    case = Case.from_id("close_in_stall-chat-tcp", "abandoned")
    result = runner.run_case(
        MockerBackend(), case, tmp_path, SETTINGS, timeout_s=90, frontend_env={}
    )
    assert unheard, result.verdict.summary()  # the request was sent, through the proxy
    reasons = unheard_close_reasons(result)
    events = {e.name: e for e in result.history.events}
    holder = events["holder_found"].data["worker"]
    assert (
        f"the frontend never counted its client's close before {holder} had to be resumed, "
        f"inside its discovery lease: whether it would move the request cannot be judged"
    ) in reasons
    assert "migration_seen" not in events
    resumed_s = events["worker_resumed"].at - events["worker_stopped"].at
    assert resumed_s < recovery.DISCOVERY_LEASE_S, resumed_s
