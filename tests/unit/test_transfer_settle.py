"""The KV transfer proof counts only the case's own transfer: a warm-up's transfer that a
lagging counter (or the frontend's mean time to first token) still shows at the request is
never taken for it. Readings are faked here, on the real monotonic clock: a counter that counts
each transfer LAG_S after its request was sent, and a frontend's time-to-first-token sums."""

import re
import time
from types import SimpleNamespace

import pytest

from handoff.cases import Case
from handoff.errors import CaseFailure
from handoff.history import History
from handoff.machine.polling import Deadline
from handoff.responses import transfers
from handoff.responses.transfers import Reading, TransferProof, lag_s, settled

CASE = Case.from_id("worker_failure-chat-stream-nats", "kv_transfer")
COUNTER = "handoff_transfers_total"
LAG_S = 0.3


class LateCounter:
    """A transfer counter that counts each transfer LAG_S after the request that made it was
    sent: `transfer()` is one such request."""

    def __init__(self, start: float = 7.0) -> None:
        self.start, self.made = start, []

    def transfer(self) -> None:
        self.made.append(time.monotonic())

    def __call__(self, deployment) -> float:
        now = time.monotonic()
        return self.start + sum(1 for at in self.made if now - at >= LAG_S)


def deployment(floor=None, counter=COUNTER):
    backend = SimpleNamespace(
        name="fake", kv_transfer_counter=counter, kv_transfer_floor_s=lambda case: floor
    )
    return SimpleNamespace(
        backend=backend, base_url="http://frontend", model=SimpleNamespace(name="m")
    )


@pytest.fixture
def late(monkeypatch):
    counter = LateCounter()
    monkeypatch.setattr(transfers, "decode_transfers", counter)
    return counter


def warmed_up(late, history, requests=3):
    """`requests` warm-ups sent one after another, each a transfer the counter shows late."""
    for _ in range(requests):
        history.record("warmup_sent")
        late.transfer()


def test_the_lag_runs_from_the_last_earlier_request_to_the_first_reading_that_counts_all():
    start = Reading(4, 0.0, 0.01)
    readings = [Reading(5, 1.0, 1.1), Reading(6, 1.2, 1.3), Reading(6, 1.4, 1.5)]
    assert lag_s(start, [0.2, 0.5], readings) == pytest.approx(1.3 - 0.5)
    assert lag_s(start, [0.2, 0.5, 0.9], readings) is None  # a third transfer not yet counted


def test_a_reading_is_settled_only_once_one_older_than_the_lag_agrees_with_it():
    readings = [Reading(6, 0.0, 0.1), Reading(6, 0.3, 0.4)]
    assert settled(readings, lag=0.5) is None  # 0.2 s apart: a late count could still come
    readings.append(Reading(6, 0.7, 0.8))
    assert settled(readings, lag=0.5) is readings[-1]
    readings.append(Reading(7, 0.9, 1.0))  # it rose after all: settled again from here on
    assert settled(readings, lag=0.5) is None


def test_a_warm_up_counted_late_is_not_taken_for_the_cases_own_transfer(late):
    """The old rule read the counter at the request, saw the warm-ups' count still rising and
    took the rise for the case's transfer; the settled reading already holds it, so a case
    whose own request made no transfer fails."""
    history = History()
    proof = TransferProof(deployment(), CASE, history, Deadline(30))
    warmed_up(late, history)
    at_the_request = late(None)  # what the old rule read: a warm-up's transfer still to come
    proof.settle()
    assert at_the_request < proof.before.value == late.start + 3
    assert late(None) > at_the_request  # the rise the old rule took for the case's transfer
    settling = next(e for e in history.events if e.name == "kv_transfer_settled").data
    assert settling["earlier_requests"] == 3 and settling["lag_s"] >= LAG_S
    proof.count_early()
    (problem,) = proof.evidence()  # the case's own request made no transfer
    assert problem.startswith(f"no KV transfer counted before the fault: timed out waiting for "
                              f"{COUNTER} to rise; last seen: {COUNTER} = 10")  # fmt: skip
    said = re.search(r"from 10, settled, for 4 times its (\d+\.\d\d) s lag", problem)
    # Rounded twice: to 2 decimals from a figure of 3, so at most 0.005 apart, in decimals.
    assert said and abs(float(said[1]) - settling["lag_s"]) <= 0.005 + 1e-9, problem


def test_the_cases_own_transfer_counted_late_proves_it(late):
    history = History()
    proof = TransferProof(deployment(), CASE, history, Deadline(30))
    warmed_up(late, history)
    proof.settle()
    late.transfer()  # the case's request
    proof.count_early()
    assert proof.evidence() == []
    checked = [e.data for e in history.events if e.name == "kv_transfer_checked"]
    assert checked == [{"counter": COUNTER, "transfers": 1}]


def test_without_an_earlier_request_the_lag_is_unknown_and_the_transfer_unproven(late):
    proof = TransferProof(deployment(), CASE, History(), Deadline(30))
    with pytest.raises(CaseFailure, match="no request of the case made a KV transfer before"):
        proof.settle()


def test_a_counter_that_never_counts_the_earlier_transfers_fails_the_case(monkeypatch):
    """Nothing measured yet bounds how late it may count them: it is awaited until the case's
    deadline, and fails it."""
    monkeypatch.setattr(transfers, "decode_transfers", lambda deployment: 7.0)
    history = History()
    proof = TransferProof(deployment(), CASE, history, Deadline(0.5))
    history.record("warmup_sent")
    with pytest.raises(CaseFailure) as raised:
        proof.settle()
    assert str(raised.value).startswith(
        f"the KV transfer is unproven: timed out waiting for {COUNTER} to count the transfers "
        f"of the case's 1 earlier requests and then hold; last seen: {COUNTER} = 7 on the "
        f"decode workers, 8 awaited"
    )


def test_the_first_token_of_a_warm_up_is_not_the_cases_own(monkeypatch):
    """Two warm-ups waited 0.45 s each for their first token (their transfer), the case's own
    request 0.02 s (none): the mean, 0.307 s, would pass a 0.3 s floor; the request's own fails."""
    readings = iter([(0.9, 2.0), (0.92, 3.0)])
    monkeypatch.setattr(transfers.metrics, "frontend_ttft", lambda url, model: next(readings))
    history = History()
    proof = TransferProof(deployment(floor=0.3), CASE, history, Deadline(30))
    proof.settle()
    (problem,) = proof.evidence()
    assert problem.startswith("time to first token 0.020 s is shorter than the KV transfer")
    checked = next(e for e in history.events if e.name == "kv_transfer_checked").data
    assert checked["first_tokens"] == 1 and checked["ttft_s"] == pytest.approx(0.02)


@pytest.mark.parametrize(("after", "problem"), [
    ((0.9, 2.0), "the frontend recorded no time to first token: the KV transfer is unproven"),
    ((1.8, 4.0), "the frontend recorded 2 first tokens since the case's request was sent, "
                 "expected its one: the KV transfer is unproven"),
])  # fmt: skip
def test_first_tokens_other_than_the_requests_one_prove_nothing(monkeypatch, after, problem):
    readings = iter([(0.9, 2.0), after])
    monkeypatch.setattr(transfers.metrics, "frontend_ttft", lambda url, model: next(readings))
    proof = TransferProof(deployment(floor=0.3), CASE, History(), Deadline(30))
    proof.settle()
    assert proof.evidence() == [problem]
