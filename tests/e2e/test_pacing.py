"""Requests sized at run time to the engine's pace (handoff.responses.pace), on the real frontend
and mocker: a backend that names its output in seconds gets a warm-up request, a request of
that many seconds of tokens, and a bound on the response derived from the same rate, past
which the case fails as hung."""

import re
import threading

import pytest

from handoff.cases import Case
from handoff.machine.polling import Deadline, poll_until
from handoff.machine.worker_logs import ANSI
from handoff.responses import pace
from handoff.runner import Settings, run_case
from handoff_mocker import MockerBackend

CASE = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")
SETTINGS = Settings(keep_logs=True)
SECONDS = 1.0


class PacedMocker(MockerBackend):
    """The mocker as if its pace differed by machine: its output is a second of tokens."""

    def output_seconds(self, case):
        return SECONDS


class StoppedSuccessor(PacedMocker):
    """The worker the request migrates to is stopped (SIGSTOP) as soon as it logs receiving
    it: with no backend stream timeout, Dynamo keeps the user's stream open for as long as the
    worker stays stopped (as issue 24 records), a hang mid-stream."""

    def __init__(self):
        super().__init__()
        self.stopped = []

    def holders(self, workers):
        held = super().holders(workers)
        if held and not self.stopped:
            others = [w for w in workers if w not in held]
            seen = {w.name: received(w) for w in others}
            threading.Thread(target=self.stop_the_successor, args=(others, seen)).start()
            self.stopped.append(None)  # watching
        return held

    def stop_the_successor(self, others, seen):
        def taken():
            late = [w for w in others if received(w) > seen[w.name]]
            return (late[0] if late else None), seen

        successor = poll_until(taken, Deadline(30), "the successor to receive the request")
        successor.process.freeze(Deadline(10))
        self.stopped[:] = [successor]


def received(worker) -> int:
    """How many requests the worker has logged receiving."""
    text = ANSI.sub("", worker.process.log_path.read_text(errors="replace"))
    return text.count("request received request_id=")


def paced(result) -> dict:
    return next(e.data for e in result.history.events if e.name == "paced")


def test_a_paced_case_asks_for_its_seconds_of_tokens_and_passes(tmp_path):
    backend = PacedMocker()
    result = run_case(backend, CASE, tmp_path, SETTINGS, timeout_s=60)
    # What this test is for is the pacing: every check made holds (a loaded machine may leave
    # the migration's boundary unproven, which is the continuity's verdict, not the pace's).
    assert not result.verdict.reasons, result.verdict.summary()
    measured = paced(result)
    # The history keeps the rate to 0.1 token/s: its product may round one token apart.
    assert abs(measured["max_tokens"] - measured["fastest_tokens_per_s"] * SECONDS) <= 1
    assert measured["slowest_tokens_per_s"] <= measured["fastest_tokens_per_s"]
    assert measured["max_tokens"] < backend.shape(CASE).max_tokens  # the seconds cut it
    sent = next(e for e in result.history.events if e.name == "request_sent")
    assert sent.data["max_tokens"] == measured["max_tokens"]


def test_a_response_open_past_its_bound_fails_the_case_as_hung(tmp_path, monkeypatch):
    monkeypatch.setattr(pace, "FIXED_S", 2.0)  # a short bound: 4 x 1 s of output + 2 s
    backend = StoppedSuccessor()
    result = run_case(backend, CASE, tmp_path, SETTINGS, timeout_s=60)
    assert backend.stopped and backend.stopped[0] is not None, "the case was not made to hang"
    assert not result.verdict.passed
    reason = result.verdict.reasons[0]
    said = re.match(r"hung: the response was still open (\d+) s after it was sent", reason)
    assert said, reason
    measured = paced(result)
    assert f"its {measured['max_tokens']} tokens at the slowest measured" in reason
    # 4 x its streaming time at the slowest warm-up's rate, + 2 s (at least 6 s: the request
    # is a second at the fastest); the history keeps the rate to 0.1 token/s.
    slowest = measured["slowest_tokens_per_s"]
    bound = pace.SLOWER_BY * measured["max_tokens"] / slowest + pace.FIXED_S
    assert abs(int(said[1]) - bound) <= 1, (reason, bound)
    assert result.seconds < 60 / 2  # the rate's bound, not the case's timeout


@pytest.mark.parametrize(
    ("fastest", "seconds", "most", "tokens"),
    [(100.0, 2.0, 512, 200), (1000.0, 2.0, 512, 512), (10.0, 1.0, 512, 64), (10.0, 1.0, 30, 30)],
)
def test_a_request_gets_its_seconds_of_tokens_within_its_shape(fastest, seconds, most, tokens):
    shape = MockerBackend().shape(CASE)
    measured = pace.Pace(slowest=fastest / 2, fastest=fastest)
    cut = pace.sized_to(measured, seconds, shape.__class__(shape.prompt, 10, most))
    assert cut.max_tokens == tokens  # the fastest rate's, at most the shape's, at least the floor
    bound = pace.response_bound_s(cut, measured)
    assert bound == 4 * tokens / (fastest / 2) + pace.FIXED_S  # at the slowest rate


class SlowToStart(MockerBackend):
    """The mocker as if a worker's first request outlasted a stall case's stream timeout."""

    slow_first_request = True


def test_a_cold_worker_is_served_its_first_request_before_a_case_with_a_stream_timeout(
    tmp_path,
):
    """Through a frontend of its own, without the stream timeout, each worker once (the round
    robin's two requests to two aggregate workers); then the case, which passes."""
    stall = Case.from_id("migration_enabled-worker_stall-chat-stream-tcp")
    result = run_case(SlowToStart(), stall, tmp_path, SETTINGS, timeout_s=60)
    assert not result.verdict.reasons, result.verdict.summary()
    log = ANSI.sub("", (tmp_path / "warm-up-frontend.log").read_text())
    assert "DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS" not in log
    selected = re.findall(r"Selected worker .*?worker_id=(\d+)", log)
    assert len(selected) == 2 and len(set(selected)) == 2, selected
    launched = [e.data["process"] for e in result.history.events if e.name == "process_launched"]
    assert launched.index("warm-up-frontend") < launched.index("frontend"), launched
