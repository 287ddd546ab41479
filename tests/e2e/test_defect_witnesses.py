"""The known defects' witnesses read off the real system, Dynamo's frontend and mocker: the
expired drain's (the worker's runtime giving up its drain, the frontend's unclassified end) and
the lapsed lease's (the worker's registrations read again from the store, none listed). Each
case is its defect only with the witness in its notes; where the system is made to differ for
real, so that the witness is not there though the reasons read as the defect's, the case fails
plainly, saying so."""

import re
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from misbehaving import WorkersWith

from handoff import runner
from handoff.cases import Case
from handoff.deployment import Deployment
from handoff.machine import etcd, worker_logs
from handoff.machine.polling import Deadline, poll_until
from handoff.policies import KNOWN_DEFECTS, KNOWN_RACES
from handoff.runner import Settings
from handoff.verdict import FAILED, KNOWN_DEFECT
from handoff_mocker import MockerBackend

TIMEOUT_S = 120
#: The cases on etcd need etcd (`nox -s tests` installs it as root).
NEEDS_ETCD = pytest.mark.skipif(bool(etcd.missing()), reason=str(etcd.missing()))


@pytest.mark.parametrize(
    ("case_id", "fault", "seen"),
    [
        (
            "migration_enabled-drain_expired-chat-stream-nats",
            "drain_expired",
            "'s log shows its drain timing out; the frontend's log shows 1 stream(s) ended "
            "without a cause it migrates on",
        ),
        (
            "migration_enabled-stall_past_lease-completion-unary-tcp",
            "stall_past_lease",
            "; the frontend lists none of them",
        ),
    ],
)
def test_the_defect_is_its_witness_read_off_the_system(case_id, fault, seen, tmp_path):
    case = Case.from_id(case_id, "aggregate")
    verdict = runner.run_case(MockerBackend(), case, tmp_path, Settings(), TIMEOUT_S).verdict
    assert verdict.outcome == KNOWN_DEFECT, verdict.summary()
    defect = KNOWN_DEFECTS[fault]
    (note,) = [n for n in verdict.notes if n.startswith(f"{defect.issue}'s witness: ")]
    assert seen in note, note


def all_but_its_witness(verdict, defect) -> str:
    """A plain failure that is `defect` in every reason (its signature, each reason one it
    explains) but the last, which says its witness is not there: that reason."""
    assert verdict.outcome == FAILED, verdict.summary()
    *reasons, absent = verdict.reasons
    assert all(sign in " | ".join(reasons) for sign in defect.signature), verdict.reasons
    assert not defect.unexplained(reasons), verdict.reasons
    return absent


@NEEDS_ETCD
def test_a_worker_that_registers_again_is_no_lost_lease(tmp_path):
    """The stalled worker, ended by Dynamo once it runs again for the lease it lost, starts
    again on its own ports (tests/reregistering_worker): a new lease, listed by the frontend,
    which routes to it. Its log is another file, so the case's probes never see it take one:
    its reasons are 3493's word for word. The witness reads the new registration listed, and
    the case fails plainly, saying so."""
    again = tmp_path / "again.log"
    folder = str(Path(__file__).resolve().parents[1] / "reregistering_worker")
    backend = WorkersWith(PYTHONPATH=folder, HANDOFF_REREGISTER_LOG=str(again))
    case = Case.from_id("stall_past_lease-chat-stream-tcp", "discovery")
    verdict = runner.run_case(backend, case, tmp_path / "case", Settings(), TIMEOUT_S).verdict
    assert worker_logs.receipts(again), "the worker started again took no request"
    defect = KNOWN_DEFECTS["stall_past_lease"]
    absent = all_but_its_witness(verdict, defect)
    listed_again = (
        rf"not {defect.issue}: its witness is not there \({re.escape(defect.witness.what)}\): "
        rf"worker-\d+-aggregate's registrations in the store now: \[(\d+)\], drawn with "
        rf"\[(\d+)\]; the frontend lists \[(\d+)\]"
    )
    found = re.fullmatch(listed_again, absent)
    assert found and found[1] == found[3] != found[2], absent


#: The frontend's log line for a chat request it answered.
ANSWERED = re.compile(r"http response sent status=200 .*uri=/v1/chat/completions")


def once_served_again(deployments: list[Deployment], act: Callable[[Deployment], object]):
    """Once etcd was started again (its member a new process, running) and the frontend has
    answered a request since, `act` on the deployment; what it returned."""
    deadline = Deadline(TIMEOUT_S)
    poll_until(lambda: (deployments or None, "not started"), deadline, "the deployment")
    (deployment,) = deployments
    cluster, frontend = deployment.pool.etcd, deployment.frontend
    first = cluster.members[0].process

    def restarted() -> tuple[bool | None, str]:
        member = cluster.members[0]
        return (member.process is not first and cluster.alive(member)) or None, "not yet"

    poll_until(restarted, deadline, "etcd to be started again")

    def answered() -> int:
        return len(worker_logs.matching(frontend.log_path, ANSWERED))

    before = answered()
    poll_until(lambda: (answered() > before or None, "none"), deadline, "a request answered")
    return act(deployment)


def revoke_frontend_lease(deployment: Deployment) -> list[int]:
    """Revoke every lease etcd holds that is no worker's: the frontend's own; those revoked."""
    cluster = deployment.pool.etcd
    workers = set().union(*deployment.pool.instance_ids.values())
    return [lease for lease in sorted(cluster.leases() - workers) if cluster.revoke(lease)]


def stop_frontend(deployment: Deployment) -> bool:
    """SIGTERM to the frontend, as an operator stops it: it shuts down by its own path."""
    return deployment.frontend.signal_leader(signal.SIGTERM)


@NEEDS_ETCD
@pytest.mark.parametrize(
    ("act", "said"),
    [
        (
            revoke_frontend_lease,
            r"the frontend's log says `Unable to maintain lease`; once it had ended, etcd held "
            r"no lease of its alive",
        ),
        (
            stop_frontend,
            r"the frontend's log never says `Unable to maintain lease`; once it had ended, etcd "
            r"held [0-9a-f]+ alive",
        ),
    ],
    ids=["lease_revoked", "sigterm"],
)
def test_a_frontend_that_did_not_give_up_a_live_lease_is_no_3493(act, said, tmp_path, monkeypatch):
    """etcd restarted within the leases, and then, on the first restart (where the race has
    never shown: docs/known-issues.md), the frontend made to end for real otherwise than by
    giving up a live lease: its lease revoked (it ends by 3493's very path, `Unable to maintain
    lease` and all, but its lease does not outlive it), or SIGTERM (its lease outlives it, but
    no such line). Either way new requests are refused and it ends with code 0: the defect's
    reasons word for word. Each half of the witness missing alone fails the case plainly."""
    deployments: list[Deployment] = []
    start = Deployment.start

    def started(deployment: Deployment, deadline: Deadline) -> None:
        start(deployment, deadline)
        deployments.append(deployment)

    monkeypatch.setattr(Deployment, "start", started)
    case = Case.from_id("etcd_restart-chat-stream-tcp", "discovery")
    with ThreadPoolExecutor(1) as pool:
        acting = pool.submit(once_served_again, deployments, act)
        verdict = runner.run_case(MockerBackend(), case, tmp_path, Settings(), TIMEOUT_S).verdict
        assert acting.result(), f"{act.__name__} changed nothing"
    defect = KNOWN_RACES[("discovery", "etcd_restart")]
    absent = all_but_its_witness(verdict, defect)
    witness = f"not {defect.issue}: its witness is not there ({defect.witness.what}): "
    assert re.fullmatch(re.escape(witness) + said, absent), absent
