"""A worker that joins while a load case's streams are in flight, on Dynamo's frontend and
mocker workers: a joiner that is listed but does not serve fails the case, and one that joins
only after every stream has ended leaves the case not proven."""

import os
import threading
from dataclasses import replace
from pathlib import Path

from handoff import runner
from handoff.cases import Case
from handoff.machine.polling import Deadline, poll_until
from handoff.metrics import MigrationCounts
from handoff.pool import Pool
from handoff.responses import joining
from handoff.runner import Settings
from handoff_mocker import MockerBackend

JOIN = Case.from_id("migration_enabled-worker_failure-chat-nats", "join")
SETTINGS = Settings(keep_logs=True)
TIMEOUT_S = 90
HELD = Path(__file__).resolve().parents[1] / "held_worker"


class HeldJoiner:
    """The joiner launched held before any of it runs (tests/held_worker) until `release`:
    it starts late by construction, not by a signal that must land before it registers."""

    def __init__(self, tmp_path: Path, monkeypatch) -> None:
        self.gate = tmp_path / "joiner-held"
        os.mkfifo(self.gate)
        self.workers = []
        add_worker, launch = Pool.add_worker, MockerBackend.worker

        def held_launch(backend, *args):
            plain = launch(backend, *args)
            path = os.pathsep.join(filter(None, [str(HELD), os.environ.get("PYTHONPATH")]))
            held = {"PYTHONPATH": path, "HANDOFF_HELD_UNTIL": str(self.gate)}
            return replace(plain, env={**plain.env, **held})

        def held_add_worker(pool, role):
            monkeypatch.setattr(MockerBackend, "worker", held_launch)
            try:
                self.workers.append(add_worker(pool, role))
            finally:
                monkeypatch.setattr(MockerBackend, "worker", launch)
            return self.workers[-1]

        monkeypatch.setattr(Pool, "add_worker", held_add_worker)

    def release(self) -> None:
        """Let the joiner start, once it waits at the gate."""
        os.close(poll_until(lambda: opened(self.gate), Deadline(30), "the joiner at its gate"))


def opened(fifo: Path) -> tuple[int | None, str]:
    """The FIFO opened for writing, once a reader waits on it."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), ""
    except OSError as exc:
        return None, str(exc)


def test_a_joiner_listed_but_frozen_fails_the_case(tmp_path, monkeypatch):
    """The joiner is held until the frontend has moved every request the faulted worker held
    (so none of them can land on it), then stops (SIGSTOP) the moment the frontend lists it:
    the probes the frontend routes to it get nothing, and the case fails saying the joiner
    never took a request (and that it did not join mid-stream)."""
    held, frozen = HeldJoiner(tmp_path, monkeypatch), []
    listed_now, init = joining.Joiner._listed_now, joining.Joiner.__init__

    def frozen_once_listed(self):
        at = listed_now(self)
        if at is not None:
            self.worker.process.freeze(Deadline(10))
            frozen.append(self.worker.name)
        return at

    def released_once_moved(self, deployment, role, history, *args):
        init(self, deployment, role, history, *args)
        threading.Thread(target=release_once_moved, args=(deployment, history)).start()

    def release_once_moved(deployment, history):
        def moved():
            fault = next((e for e in history.events if e.name == "fault_sent"), None)
            if fault is None:
                return None, "no fault sent yet"
            counts = MigrationCounts.read(deployment.base_url + "/metrics", deployment.model_name)
            return (True if counts.succeeded >= fault.data["holding"] else None), str(counts)

        poll_until(moved, Deadline(60), "every request the faulted worker held moved")
        held.release()

    monkeypatch.setattr(joining.Joiner, "_listed_now", frozen_once_listed)
    monkeypatch.setattr(joining.Joiner, "__init__", released_once_moved)
    result = runner.run_case(MockerBackend(), JOIN, tmp_path, SETTINGS, TIMEOUT_S)
    assert frozen == [w.name for w in held.workers], "the joiner was never listed and frozen"
    assert not result.verdict.passed
    joiner = next(e for e in result.history.events if e.name == "worker_joining").data["worker"]
    said = f"{joiner}, started as the fault landed, never took a request (it still runs): timed out"
    assert any(r.startswith(said) for r in result.verdict.reasons), result.verdict.reasons
    assert any("did not join mid-stream" in u for u in result.verdict.unproven)


def test_a_joiner_listed_after_every_stream_ended_is_not_proven(tmp_path, monkeypatch):
    """The joiner is held before any of it runs until every request of the case has ended, as
    a replacement slower to start than the requests last: the case did not show a join
    mid-stream, and says so as not proven."""
    held = HeldJoiner(tmp_path, monkeypatch)
    problems = joining.Joiner.problems

    def problems_after_the_release(self, *args):
        held.release()  # every request has ended
        poll_until(lambda: (self.listed_at, self.seen), Deadline(30), "the released joiner listed")
        return problems(self, *args)

    monkeypatch.setattr(joining.Joiner, "problems", problems_after_the_release)
    result = runner.run_case(MockerBackend(), JOIN, tmp_path, SETTINGS, TIMEOUT_S)
    assert held.workers and not result.verdict.passed
    # Not proven alone fails it: the late joiner serves once the load is over.
    assert result.verdict.reasons == []
    assert any("did not join mid-stream" in u for u in result.verdict.unproven)
