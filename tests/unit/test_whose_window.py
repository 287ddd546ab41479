"""Whose is a request over before its fault: the harness's (a missed window, not proven) only
where the evidence says the request was in the fault's reach and ended as it should; else the
system's failure. On recorded responses; tests/e2e/test_windows.py makes each for real."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from handoff import faults
from handoff.client import Chunk, Request, Response
from handoff.errors import CaseFailure, MissedWindow
from handoff.faults import FaultReport
from handoff.metrics import MigrationCounts
from handoff.policies import OUTCOMES
from handoff.responses import load
from handoff.verdict import FAILED, NOT_PROVEN, judge

ID = "9f1c2e4a-0000-4000-8000-000000000001"


def over(tokens: int = 8, complete: bool = True) -> SimpleNamespace:
    """A request of `tokens` over: whole, or cut by a 500 after one token."""
    frames = [{"id": f"chatcmpl-{ID}", "choices": [{"delta": {"content": "t1"}}]}]
    if complete:
        end = {"delta": {"content": "t2"}, "finish_reason": "length"}
        frames.append({"id": f"chatcmpl-{ID}", "choices": [end], "usage": {
            "completion_tokens": tokens}})  # fmt: skip
    response = Response(200, chunks=[Chunk(0.0, f) for f in frames], done=complete)
    response.streamed = True
    if not complete:
        response.error = {"message": "Internal server error", "code": 500}
    return SimpleNamespace(request=Request("chat", True, "m", "p", tokens), response=response,
                           finished=True)  # fmt: skip


def worker(tmp_path, name: str, logged: str = "") -> SimpleNamespace:
    log = tmp_path / f"{name}.log"
    log.write_text(logged)
    return SimpleNamespace(name=name, process=SimpleNamespace(log_path=log))


def test_a_request_over_before_any_holder_is_missed_only_where_a_worker_logged_it(tmp_path):
    """Held by a target worker (its log names the request) and ended before a reading showed
    it: the harness's miss. Named by none of them: the role the fault aims at never served it."""
    logged = f"2026-12-07T09:07:57.786444Z  INFO push_handler: request received request_id={ID}\n"
    taken = worker(tmp_path, "worker-0-prefill", logged)
    assert isinstance(faults.ended_unheld([taken], over()), MissedWindow)
    idle = worker(tmp_path, "worker-1-prefill")
    unheld = faults.ended_unheld([idle], over())
    assert isinstance(unheld, CaseFailure) and not isinstance(unheld, MissedWindow)
    assert "no log of worker-1-prefill names it" in str(unheld)


def test_a_cut_response_outranks_a_complete_one_among_those_over(tmp_path):
    """Of a load's requests over before the fault, one the system cut fails the case, whatever
    order they are in; only when every one ended complete is it a missed window."""
    held = [load.Held(0, over()), load.Held(1, over(complete=False))]
    ended = load.first_ended(held, "when held")
    assert isinstance(ended, CaseFailure) and not isinstance(ended, MissedWindow)
    assert "request 1 " in str(ended)
    assert isinstance(load.first_ended(held[:1], "when held"), MissedWindow)


NONE = MigrationCounts(0, 0, 0, 0, 0)
ENABLED = OUTCOMES[("decoding", "migration_enabled")]


@pytest.mark.parametrize(
    ("room_proven", "outcome"), [(False, NOT_PROVEN), (True, FAILED)], ids=["late", "room"]
)
def test_a_drain_that_let_its_request_finish_is_missed_only_when_sent_late(room_proven, outcome):
    """A drained worker ended the request complete within its drain, no move counted: where
    the SIGTERM went out with less left than the drain's wait, the harness was late; where the
    request had more left, the worker served it on past its drain: the system's failure."""
    drained = FaultReport("drain_expired", "worker-1", 2, ("SIGTERM",), True)
    drained = replace(drained, room_proven=room_proven)
    response = over().response
    verdict = judge(ENABLED, "migration_enabled", response, NONE, drained, 8, "exact")
    assert verdict.outcome == outcome, verdict.summary()
    if room_proven:
        assert verdict.reasons[0].startswith("the response ended complete before SIGTERM reached")
        assert verdict.reasons[0].endswith("worker-1 served it on past its drain")
