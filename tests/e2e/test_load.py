"""Many requests at once on Dynamo's frontend and mocker workers: a system that loses one of
them, or migrates none, fails the load case for that reason, each request it concerns named."""

import re
import signal
import threading
from typing import ClassVar

from injections import replace_lifecycle, wrap_injections

from handoff import client, faults, runner
from handoff.cases import Case
from handoff.machine import worker_logs
from handoff.machine.polling import Deadline, poll_until
from handoff.policies import POLICIES
from handoff.responses import load
from handoff.responses.waits import STREAM_TIMEOUT_ENV
from handoff.runner import Settings
from handoff_mocker import MockerBackend

LOAD = Case.from_id("migration_enabled-worker_failure-chat-nats", "load")
SETTINGS = Settings(keep_logs=True)
TIMEOUT_S = 90


class ShortLoad(MockerBackend):
    """Requests of 400 tokens, not 900: what these checks need of a load case, at half its
    CPU; and the bound, which allows each of them again, comes sooner."""

    defaults: ClassVar[dict[str, object]] = {**MockerBackend.defaults, "max_tokens": {"load": 400}}


def event(result, name: str) -> dict:
    return next(e for e in result.history.events if e.name == name).data


def test_migration_secretly_off_fails_each_cut_request_and_the_counts(tmp_path):
    result = runner.run_case(
        ShortLoad(), LOAD, tmp_path, SETTINGS, TIMEOUT_S, POLICIES["migration_disabled"]
    )
    assert not result.verdict.passed
    victim = event(result, "fault_sent")["worker"]
    cut = [r["n"] for r in event(result, "requests_placed")["requests"] if r["worker"] == victim]
    named = [r for r in result.verdict.reasons if r.startswith("request ")]
    assert len(cut) >= 3 and sorted({int(r.split()[1]) for r in named}) == sorted(cut)
    assert all(f"on {victim})" in r for r in named)
    assert f"migration counter succeeded = 0, expected {len(cut)}" in result.verdict.reasons


def test_a_stream_the_client_drops_is_one_request_lost_and_named(tmp_path, monkeypatch):
    """Once the fault has landed, the client stops reading one stream and closes it, as a
    user's connection drops: the frontend still serves the other requests, and the case fails
    for the one that never completed, by its number alone."""
    landed = threading.Event()

    def injected(inject):
        def landing(*args):
            report = inject(*args)
            landed.set()
            return report

        return landing

    read_stream, readers, lock = client._read_stream, [], threading.Lock()

    def drop_one(body, response):
        with lock:
            readers.append(response)
            first = len(readers) == 1
        return read_stream(body if not first else until_dropped(body), response)

    def until_dropped(body):
        """The stream's pieces until three have come after the fault; then `send` returns,
        closing the connection."""
        after = 0
        for piece in body:
            yield piece
            after += landed.is_set()
            if after == 3:
                return

    wrap_injections(monkeypatch, injected)
    monkeypatch.setattr(client, "_read_stream", drop_one)
    result = runner.run_case(ShortLoad(), LOAD, tmp_path, SETTINGS, TIMEOUT_S)
    assert landed.is_set() and not result.verdict.passed
    named = [r for r in result.verdict.reasons if r.startswith("request ")]
    assert len({r.split(" (")[0] for r in named}) == 1, result.verdict.reasons
    assert "finish_reason None, expected 'length'" in named[0]


def test_a_worker_that_freezes_instead_of_dying_leaves_its_requests_hung_each_named(
    tmp_path, monkeypatch
):
    """The fault stops the busiest worker instead of killing it, on a frontend with no stream
    timeout (a kill's case sets none): its requests never end, and the case fails as hung once
    its bound has passed, well before the case deadline, naming each of them."""

    def freeze(run, holder, watched, aimed):
        holder.process.freeze(run.deadline)
        pid = holder.process.pid
        return faults.FaultReport(run.case.fault, holder.name, pid, ("SIGSTOP",), False)

    replace_lifecycle(monkeypatch, "worker_failure", inject=freeze)
    case = Case.from_id("migration_disabled-worker_failure-completion-tcp", "load")
    result = runner.run_case(ShortLoad(), case, tmp_path, SETTINGS, TIMEOUT_S)
    assert not result.verdict.passed
    (reason,) = [r for r in result.verdict.reasons if r.startswith("hung:")]
    victim = event(result, "fault_sent")["worker"]
    cut = [r["n"] for r in event(result, "requests_placed")["requests"] if r["worker"] == victim]
    assert sorted(map(int, re.findall(r"request (\d+) \(", reason))) == sorted(cut)
    events = {e.name: e for e in result.history.events}
    waited = events["teardown_done"].at - events["fault_sent"].at
    assert events["response_bound"].data["seconds"] <= waited < TIMEOUT_S - 15


def test_a_second_fault_on_the_worker_a_request_moved_to_is_a_duplicated_migration(
    tmp_path, monkeypatch
):
    """Once a cut request has moved, the worker it moved to is SIGKILLed too: that request
    migrates a second time, with the other's, and the exact counters fail the case."""
    seen: dict[str, object] = {}
    busiest = load.busiest

    def noted(held, workers):
        seen.update(held=held, workers=workers)
        return busiest(held, workers)

    def and_again(inject):
        return lambda run, holder, *rest: again(inject(run, holder, *rest))

    def again(report):
        ids = {h.request.request_id for h in seen["held"]}

        def moved_to():
            twice = [w for w in worker_logs.received(seen["workers"], ids).values() if len(w) > 1]
            return (twice[0][-1] if twice else None), "no request received twice yet"

        second = poll_until(moved_to, Deadline(30), "a cut request to reach another worker")
        taker = next(w for w in seen["workers"] if w.name == second)
        seen["second"] = taker.name
        taker.process.signal_tree(signal.SIGKILL)
        return report

    monkeypatch.setattr(load, "busiest", noted)
    wrap_injections(monkeypatch, and_again)
    result = runner.run_case(ShortLoad(), LOAD, tmp_path, SETTINGS, TIMEOUT_S)
    assert not result.verdict.passed and "second" in seen
    counted = re.search(
        r"migration counter ongoing_request = (\d+), expected 3", " ".join(result.verdict.reasons)
    )
    assert counted and int(counted.group(1)) > 3, result.verdict.reasons


def test_a_stream_timeout_below_the_queue_waits_moves_healthy_requests_and_fails_plainly(
    tmp_path,
):
    """The load stall on a frontend whose stream timeout is the single request's 3 s, not the
    one sized above the queues: a request queued on a healthy worker (the busiest survivor's
    third waits a whole 5.2 s response) moves too, the counters exceed the three cut, and the
    case fails for it plainly: the stall still outlives the lease, and the verdict says that
    the lease's known defect does not explain the count."""
    case = Case.from_id("migration_enabled-worker_stall-chat-nats", "load")
    env = {STREAM_TIMEOUT_ENV: "3"}
    result = runner.run_case(MockerBackend(), case, tmp_path, SETTINGS, TIMEOUT_S, frontend_env=env)
    assert not result.verdict.passed and not result.verdict.upstream_defect
    counted = re.search(
        r"migration counter ongoing_request = (\d+), expected 3", " ".join(result.verdict.reasons)
    )
    assert counted and int(counted.group(1)) > 3, result.verdict.reasons
    named = result.verdict.reasons[-1]
    assert named.startswith("not Dynamo issue 3493 alone: it does not explain: "), named
    assert counted.group(0) in named
