"""A worker that joins while a load case's streams are in flight, on Dynamo's frontend and
mocker workers: a joiner that is listed but does not serve fails the case, and one that joins
only after every stream has ended leaves the case not proven."""

import signal
import threading

from handoff import runner
from handoff.cases import Case
from handoff.polling import Deadline, poll_until
from handoff.pool import Pool
from handoff.responses import joining
from handoff.runner import Settings
from handoff_mocker import MockerBackend

JOIN = Case.from_id("migration_enabled-worker_failure-chat-nats", "join")
SETTINGS = Settings(keep_logs=True)
TIMEOUT_S = 90


def test_a_joiner_listed_but_frozen_fails_the_case(tmp_path, monkeypatch):
    """The joiner stops (SIGSTOP) the moment the frontend lists it: the probes the frontend
    routes to it get nothing, and the case fails saying the joiner never took a request (and
    that it did not join mid-stream)."""
    listed_now = joining.Joiner._listed_now

    def frozen_once_listed(self):
        at = listed_now(self)
        if at is not None:
            self.worker.process.freeze(Deadline(10))
        return at

    monkeypatch.setattr(joining.Joiner, "_listed_now", frozen_once_listed)
    result = runner.run_case(MockerBackend(), JOIN, tmp_path, SETTINGS, TIMEOUT_S)
    assert not result.verdict.passed
    joiner = next(e for e in result.history.events if e.name == "worker_joining").data["worker"]
    said = f"{joiner}, started as the fault landed, never took a request: timed out waiting"
    assert any(r.startswith(said) for r in result.verdict.reasons), result.verdict.reasons
    assert any("did not join mid-stream" in u for u in result.verdict.unproven)


def test_a_joiner_listed_after_every_stream_ended_is_not_proven(tmp_path, monkeypatch):
    """The joiner is held (SIGSTOP) from its start until every request of the case has ended,
    as a replacement slower to start than the requests last: the case did not show a join
    mid-stream, and says so as not proven."""
    add_worker, held = Pool.add_worker, []

    def held_until_the_load_ends(self, role):
        worker = add_worker(self, role)
        worker.process.freeze(Deadline(10))
        held.append(worker)
        threading.Thread(target=thaw_after_the_load, args=(worker,), daemon=True).start()
        return worker

    ended = threading.Event()
    problems = joining.Joiner.problems

    def thaw_after_the_load(worker):
        poll_until(lambda: (True if ended.is_set() else None, "open"), Deadline(60), "the load")
        worker.process.signal_tree(signal.SIGCONT)

    def problems_after_the_thaw(self, *args):
        ended.set()
        poll_until(lambda: (self.listed_at, self.seen), Deadline(30), "the thawed joiner listed")
        return problems(self, *args)

    monkeypatch.setattr(Pool, "add_worker", held_until_the_load_ends)
    monkeypatch.setattr(joining.Joiner, "problems", problems_after_the_thaw)
    result = runner.run_case(MockerBackend(), JOIN, tmp_path, SETTINGS, TIMEOUT_S)
    assert held and not result.verdict.passed
    # Not proven alone fails it: the late joiner serves once the load is over.
    assert result.verdict.reasons == []
    assert any("did not join mid-stream" in u for u in result.verdict.unproven)
