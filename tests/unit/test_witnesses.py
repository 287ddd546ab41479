"""Each known defect's witness reader, on what the system leaves (its logs, its store, the
case's timeline): seen where the mechanism is there, not where it is not, unknown where the
reading failed. The readers' inputs are stand-ins here, each shaped as Dynamo 1.6.1 gave them
(the logs' lines are copied from the main job's runs, 2026-12-07);
tests/e2e/test_defect_witnesses.py reads them off the real system."""

from types import SimpleNamespace

import requests

from handoff.history import History
from handoff.machine.etcd import Unanswered
from handoff.responses import witnesses

TIMED_OUT = (
    "2026-12-07T12:11:38.054289Z ERROR dynamo_runtime::runtime: Graceful endpoint shutdown timed "
    "out; proceeding with runtime teardown timeout_secs=1 remaining_endpoints=1"
)
INGRESS_TIMED_OUT = (
    "2026-12-07T12:11:38.1Z WARN dynamo_runtime::pipeline::network::ingress: Timed out waiting "
    'for inflight requests to drain; proceeding with shutdown endpoint_name="generate"'
)
UNCLASSIFIED = (
    "2026-12-07T12:11:38.201514Z ERROR http-request: dynamo_llm::http::service::disconnect: "
    "Semantic streaming failure class=Internal reason=runtime.unclassified "
    'diagnostic=Some("All output transmitters closed")'
)


def logged(tmp_path, worker_lines, frontend_lines):
    worker_log, frontend_log = tmp_path / "worker.log", tmp_path / "frontend.log"
    worker_log.write_text("\n".join(worker_lines) + "\n")
    frontend_log.write_text("\n".join(frontend_lines) + "\n")
    worker = SimpleNamespace(
        name="worker-1-aggregate", process=SimpleNamespace(log_path=worker_log)
    )
    deployment = SimpleNamespace(frontend=SimpleNamespace(log_path=frontend_log))
    return deployment, worker


def test_a_drain_given_up_and_an_unclassified_end_is_the_drains_witness(tmp_path):
    for gave_up in (TIMED_OUT, INGRESS_TIMED_OUT):
        deployment, worker = logged(tmp_path, ["INFO x", gave_up], [UNCLASSIFIED])
        seen, said = witnesses.drain_cut(deployment, worker, History())
        assert seen, said


def test_a_drain_that_never_timed_out_or_an_end_classed_otherwise_is_no_witness(tmp_path):
    migratable = UNCLASSIFIED.replace("runtime.unclassified", "worker.disconnected")
    for worker_lines, frontend_lines in (
        (["INFO All inflight requests completed"], [UNCLASSIFIED]),
        ([TIMED_OUT], [migratable]),
    ):
        deployment, worker = logged(tmp_path, worker_lines, frontend_lines)
        seen, said = witnesses.drain_cut(deployment, worker, History())
        assert seen is False, said


def test_an_unreadable_log_is_unknown(tmp_path):
    deployment, worker = logged(tmp_path, [TIMED_OUT], [UNCLASSIFIED])
    worker.process.log_path = tmp_path / "gone" / "worker.log"
    assert witnesses.drain_cut(deployment, worker, History())[0] is None


def store(drawn, now, listed, fails=None):
    """A deployment whose worker was drawn with instance ids `drawn`, whose store holds `now`
    for it, and whose frontend lists `listed`; `fails`: what reading either raises."""

    def registered(port):
        if fails:
            raise fails
        return set(now)

    def listing():
        return {("backend", "generate"): set(listed)}, ["handoff-mocker"]

    pool = SimpleNamespace(
        instance_ids={"worker-0-aggregate": set(drawn)},
        discovery=SimpleNamespace(instance_ids=registered),
    )
    worker = SimpleNamespace(name="worker-0-aggregate", ports={"system": 1})
    return SimpleNamespace(pool=pool, listing=listing), worker


def test_a_worker_whose_registrations_none_are_listed_is_the_leases_witness():
    for now in (set(), {7}):
        deployment, worker = store({5}, now, {9})
        seen, said = witnesses.unlisted(deployment, worker, History())
        assert seen, said


def test_a_worker_registered_again_and_listed_is_no_witness():
    """On etcd a worker that registers again gets a new lease: listed under it, it is not
    lost, whatever the ids it was drawn with."""
    deployment, worker = store({5}, {7}, {7, 9})
    seen, said = witnesses.unlisted(deployment, worker, History())
    assert seen is False and "lists [7]" in said


def test_a_store_that_does_not_answer_is_unknown():
    for failure in (Unanswered("no etcd member answered"), requests.ConnectionError("refused")):
        deployment, worker = store({5}, set(), set(), fails=failure)
        assert witnesses.unlisted(deployment, worker, History())[0] is None


def raced(*events):
    history = History()
    for name, at, data in events:
        history.record_at(name, history.started + at, **data)
    return history


WORKER = SimpleNamespace(name="worker-1-decode")


def test_the_lost_request_running_after_the_move_with_nothing_delivered_is_the_races_witness():
    history = raced(
        ("trial", 0.0, {}),
        ("chunk", 1.0, {"text": " t1"}),
        ("migration_seen", 2.0, {}),
        ("worker_resumed", 2.01, {}),
        ("lost_request_running", 2.05, {"running": 1}),
    )
    seen, said = witnesses.lost_ran_on(None, WORKER, history)
    assert seen, said


def test_a_token_after_the_move_or_no_request_running_is_no_race_witness():
    for extra in (
        [("lost_request_running", 2.05, {"running": 1}), ("chunk", 3.0, {"text": " t2"})],
        [],
    ):
        history = raced(("trial", 0.0, {}), ("migration_seen", 2.0, {}), *extra)
        seen, said = witnesses.lost_ran_on(None, WORKER, history)
        assert seen is False, said


def test_only_the_last_trial_witnesses_the_race():
    history = raced(
        ("trial", 0.0, {}),
        ("migration_seen", 2.0, {}),
        ("lost_request_running", 2.05, {"running": 1}),
        ("trial", 5.0, {}),
        ("migration_seen", 6.0, {}),
    )
    assert witnesses.lost_ran_on(None, WORKER, history)[0] is False


def leases(*reads):
    return raced(*[("frontend_lease_read", float(at), read) for at, read in enumerate(reads)])


GAVE_UP = (
    "2026-12-07T13:59:10.847618Z ERROR dynamo_runtime::transports::etcd::lease: Unable to "
    "maintain lease. Check etcd server status error=Unable to reconnect to ETCD cluster: "
    "deadline exceeded"
)


def frontend_logged(tmp_path, *lines):
    log = tmp_path / "frontend.log"
    log.write_text("\n".join(lines) + "\n")
    return SimpleNamespace(frontend=SimpleNamespace(log_path=log))


#: The readings of the restart's rows under the busy loop (2026-12-07): renewed up to the end,
#: 5 s left once the frontend had ended.
RENEWED = leases(
    {"left": {"a1": 10}, "frontend_running": True},
    {"left": {"a1": 5}, "frontend_running": True},
    {"left": {"a1": 9}, "frontend_running": True},
    {"left": {"a1": 5}, "frontend_running": False},
)


def test_a_frontend_that_gave_up_a_live_lease_is_the_restarts_witness(tmp_path):
    seen, said = witnesses.frontend_gave_up(frontend_logged(tmp_path, GAVE_UP), None, RENEWED)
    assert seen, said


def test_a_frontend_whose_lease_ran_out_or_that_never_gave_up_is_no_witness(tmp_path):
    """A lease gone by the end is a lease lost, not let go; a frontend whose log says nothing
    of its lease ended for another reason."""
    ran_out = leases(
        {"left": {"a1": 3}, "frontend_running": True},
        {"left": {"a1": None}, "frontend_running": False},
    )
    given_up = frontend_logged(tmp_path, GAVE_UP)
    assert witnesses.frontend_gave_up(given_up, None, ran_out)[0] is False
    silent = frontend_logged(tmp_path, "INFO Runtime shutdown initiated")
    assert witnesses.frontend_gave_up(silent, None, RENEWED)[0] is False


def test_leases_unread_once_the_frontend_ended_are_unknown(tmp_path):
    given_up = frontend_logged(tmp_path, GAVE_UP)
    unread = leases(
        {"left": {"a1": 8}, "frontend_running": True},
        {"failed": "no etcd member answered", "frontend_running": False},
    )
    assert witnesses.frontend_gave_up(given_up, None, unread)[0] is None


REJECTED = (
    "2026-12-07T21:54:51.990638Z ERROR dynamo_llm::discovery::controller: Rejected incompatible "
    "workers; the first accepted configuration retains the WorkerSet model=handoff-mocker "
    'worker_set=["dynamo","backend","generate","chat|completions","aggregated"] '
    "incumbent_checksum=3ac1e04e rejected_checksum=4f65f14a"
)
#: 1.5.1's line for a stream its worker's expired drain ended (`releases.Facts.unmigrated_end`).
TRANSMITTERS_CLOSED = (
    "2026-12-07T21:16:15.818823Z ERROR http-request: dynamo_llm::preprocessor: Error processing "
    "common response: All output transmitters closed"
)


NO_WORKER = (
    "2026-12-07T21:54:52.463964Z  WARN http-request: dynamo_llm::migration: Cannot recreate "
    "stream error=Unavailable: No workers available for endpoint dynamo/backend/generate"
)


def counted(failed: int) -> History:
    history = History()
    history.record("metrics_read", counts={"failed": failed})
    return history


def test_a_frontend_that_rejected_workers_of_the_model_is_the_mixed_sets_witness(tmp_path):
    """Read off the frontend alone (a rolling upgrade strikes every worker, none in
    particular): its rejection, and as many moves that found no worker as it counted failed."""
    deployment, _ = logged(tmp_path, [], ["INFO x", REJECTED, NO_WORKER, NO_WORKER])
    seen, said = witnesses.rejected_workers(deployment, None, counted(2))
    assert seen and "1 rejection(s)" in said and "2 move(s) that found no worker" in said
    # A third move failed for another reason: not this.
    assert witnesses.rejected_workers(deployment, None, counted(3))[0] is False
    deployment, _ = logged(tmp_path, [], ["INFO accepted the worker set", NO_WORKER])
    assert witnesses.rejected_workers(deployment, None, counted(1))[0] is False
    assert witnesses.rejected_workers(deployment, None, History())[0] is None  # counters unread
    deployment.frontend.log_path = tmp_path / "gone.log"
    assert witnesses.rejected_workers(deployment, None, counted(1))[0] is None


def test_the_drains_witness_reads_the_line_of_the_installed_release(tmp_path, monkeypatch):
    from handoff import releases

    deployment, worker = logged(tmp_path, [TIMED_OUT], [TRANSMITTERS_CLOSED])
    assert witnesses.drain_cut(deployment, worker, History())[0] is False  # not 1.6's line
    monkeypatch.setattr(releases, "current", lambda: releases.facts("1.5.1"))
    assert witnesses.drain_cut(deployment, worker, History())[0] is True
