"""Whose is a request over before its fault: the harness's (a missed window, not proven) only
where the evidence says the request was in the fault's reach and ended as it should; else the
system's failure. On recorded responses; tests/e2e/test_windows.py makes each for real."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from handoff import faults, lifecycle
from handoff.client import Chunk, Request, Response
from handoff.errors import CaseFailure, MissedWindow
from handoff.faults import FaultReport
from handoff.metrics import MigrationCounts
from handoff.policies import OUTCOMES
from handoff.responses import load
from handoff.responses.waits import Settings
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


#: (fault, its room proven at the SIGTERM, seconds from the SIGTERM to the response's end):
#: the verdict. A drain_expired worker's own 1 s timeout ends the request: one it let end
#: complete with room proven, or well past its timeout, it served on past its drain. A
#: graceful_shutdown's SIGKILL is the harness's at 2 s: a response over after the bound
#: (the SIGKILL late) is the harness's miss, room or not; over before it with room, the
#: system's.
DRAINS_ENDED = {
    "expired, sent late, ended in its timeout": ("drain_expired", False, 0.8, NOT_PROVEN),
    "expired, room proven": ("drain_expired", True, 0.8, FAILED),
    "expired, no room known, ran on past its timeout": ("drain_expired", False, 3.5, FAILED),
    "graceful, room proven, over before the bound": ("graceful_shutdown", True, 1.5, FAILED),
    "graceful, room proven, SIGKILL late": ("graceful_shutdown", True, 2.6, NOT_PROVEN),
    "graceful, sent late": ("graceful_shutdown", False, 1.5, NOT_PROVEN),
}


@pytest.mark.parametrize(
    ("fault", "room_proven", "after_s", "outcome"),
    DRAINS_ENDED.values(),
    ids=DRAINS_ENDED.keys(),
)
def test_a_drain_that_let_its_request_finish_is_missed_only_where_its_timing_excuses_it(
    fault, room_proven, after_s, outcome
):
    """A drained worker ended the request complete within its drain, no move counted: the
    harness's miss, or the worker's serving on past its drain, as the drain's own timing says
    (`FaultReport.blames`)."""
    bound_s = lifecycle.of(fault).runs_on(Settings(graceful_bound_s=2.0))
    signals = ("SIGTERM",) if fault == "drain_expired" else ("SIGTERM", "SIGKILL")
    drained = FaultReport(fault, "worker-1", 2, signals, True)
    drained = replace(
        drained, room_proven=room_proven, signalled_at=100.0, bound_s=bound_s,
        ends_itself=fault == "drain_expired",
    )  # fmt: skip
    response = over().response
    response.finished_at = 100.0 + after_s
    verdict = judge(ENABLED, "migration_enabled", response, NONE, drained, 8, "exact")
    assert verdict.outcome == outcome, verdict.summary()
    if outcome == FAILED:
        assert verdict.reasons[0].startswith("the response ended complete before SIG")
        assert verdict.reasons[0].endswith("worker-1 served it on past its drain")


def test_a_holder_held_after_generating_the_whole_response_is_a_missed_window():
    """Every token out, the frontend still delivering: the worker holds nothing, and a fault
    on it would leave a response that completes with no move, blamed on the system."""
    inflight = SimpleNamespace(finished=False, response=Response(200))
    tokens = [7]
    watch = faults.Watch(inflight, all_out=(lambda: tokens[0], 8))
    assert watch.outside("when held") is None
    tokens[0] = 8
    missed = watch.outside("when held")
    assert isinstance(missed, MissedWindow) and "all 8 tokens were out when held" in str(missed)
