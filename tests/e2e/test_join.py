"""A worker that joins while a load case's streams are in flight, on Dynamo's frontend and
mocker workers: a joiner that is listed but does not serve fails the case, and one that joins
only after every stream has ended leaves the case not proven."""

import os
from dataclasses import replace
from pathlib import Path

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
HELD = Path(__file__).resolve().parents[1] / "held_worker"


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


def opened(fifo: Path) -> tuple[int | None, str]:
    """The FIFO opened for writing, once a reader waits on it."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), ""
    except OSError as exc:
        return None, str(exc)


def test_a_joiner_listed_after_every_stream_ended_is_not_proven(tmp_path, monkeypatch):
    """The joiner is held before any of it runs (tests/held_worker) until every request of the
    case has ended, as a replacement slower to start than the requests last: the case did not
    show a join mid-stream, and says so as not proven."""
    gate = tmp_path / "joiner-held"
    os.mkfifo(gate)
    add_worker, launch, held = Pool.add_worker, MockerBackend.worker, []

    def held_until_the_load_ends(self, role):
        monkeypatch.setattr(MockerBackend, "worker", held_launch)
        try:
            worker = add_worker(self, role)
        finally:
            monkeypatch.setattr(MockerBackend, "worker", launch)
        held.append(worker)
        return worker

    def held_launch(self, *args):
        plain = launch(self, *args)
        path = os.pathsep.join(filter(None, [str(HELD), os.environ.get("PYTHONPATH")]))
        env = {**plain.env, "PYTHONPATH": path, "HANDOFF_HELD_UNTIL": str(gate)}
        return replace(plain, env=env)

    problems = joining.Joiner.problems

    def problems_after_the_release(self, *args):
        # Every request has ended: let the joiner start, once it waits at the gate.
        os.close(poll_until(lambda: opened(gate), Deadline(30), "the joiner at its gate"))
        poll_until(lambda: (self.listed_at, self.seen), Deadline(30), "the released joiner listed")
        return problems(self, *args)

    monkeypatch.setattr(Pool, "add_worker", held_until_the_load_ends)
    monkeypatch.setattr(joining.Joiner, "problems", problems_after_the_release)
    result = runner.run_case(MockerBackend(), JOIN, tmp_path, SETTINGS, TIMEOUT_S)
    assert held and not result.verdict.passed
    # Not proven alone fails it: the late joiner serves once the load is over.
    assert result.verdict.reasons == []
    assert any("did not join mid-stream" in u for u in result.verdict.unproven)
