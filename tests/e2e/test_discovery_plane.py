"""Without etcd, the cases on etcd are reported not run in one line, and the rest run.

Each check of the discovery plane's cases can fail: a real deployment on etcd, misconfigured
for real (a lease longer than the one handoff gives, a keep-alive too slow to notice a revoke,
processes that know one etcd member only), makes the case fail with a reason that names what
went wrong, and a known defect's case then fails plainly; nothing is left running, and no etcd
data folder is left behind."""

from dataclasses import replace
from pathlib import Path

import pytest
from misbehaving import WorkersWith
from without_binary import not_run, run_without

from handoff import runner
from handoff.cases import Case
from handoff.machine import etcd, ownership
from handoff.pool import Pool
from handoff.responses import discovery_plane
from handoff.responses.lifecycles import LOSS_LEASE_S
from handoff.runner import Settings
from handoff.verdict import FAILED
from handoff_mocker import MockerBackend

SETTINGS = Settings(keep_logs=True)

#: The checks of a deployment on etcd need etcd (`nox -s tests` installs it as root).
NEEDS_ETCD = pytest.mark.skipif(bool(etcd.missing()), reason=str(etcd.missing()))


#: A lease six times the one handoff gives Dynamo: a dead or cut-off worker stays listed.
LONG_LEASE = WorkersWith(ETCD_LEASE_TTL="60")
#: Workers whose process outlives their own shutdown by a minute (tests/lingering_worker).
LINGERING = WorkersWith(
    PYTHONPATH=str(Path(__file__).resolve().parents[1] / "lingering_worker"), HANDOFF_LINGER_S="60"
)


def failed(backend, case_id: str, folder, records) -> str:
    """Run the discovery case against the misconfigured system: it must fail plainly (never as
    its known defect); every process gone and no etcd data folder left."""
    case = Case.from_id(case_id, "discovery")
    result = runner.run_case(backend, case, folder, SETTINGS, timeout_s=120)
    assert result.verdict.outcome == FAILED, result.verdict
    assert list((records / "folders").glob("*")) == []
    return " | ".join(result.verdict.reasons)


@pytest.fixture
def records(tmp_path, monkeypatch):
    """The test's own process records, and so its own owned folders."""
    folder = tmp_path / "records"
    monkeypatch.setenv(ownership.STATE_ENV, str(folder))
    return folder


@NEEDS_ETCD
def test_a_dead_worker_listed_past_its_lease_fails_the_case(tmp_path, records):
    reasons = failed(LONG_LEASE, "lease_expiry-chat-stream-tcp", tmp_path, records)
    assert "the frontend still listed worker-" in reasons and "15 s after the fault" in reasons


@NEEDS_ETCD
def test_a_worker_that_outlives_its_revoked_lease_fails_the_case(tmp_path, records):
    reasons = failed(LINGERING, "lease_revoked-completion-stream-nats", tmp_path, records)
    assert "still ran 15 s after its lease was revoked" in reasons


@NEEDS_ETCD
def test_a_cut_that_cannot_be_proven_is_no_known_defect(tmp_path, records):
    """On a lease six times handoff's, the worker sends etcd nothing while the cut is proven:
    the case fails plainly by that, never as Dynamo issue 3493."""
    reasons = failed(LONG_LEASE, "etcd_partition-chat-unary-tcp", tmp_path, records)
    assert "timed out waiting for the partition of worker-" in reasons


@NEEDS_ETCD
def test_workers_that_outlive_a_lost_etcd_fail_the_case(tmp_path, records):
    """Workers given a 60 s lease outlive the case's: its own lease
    (`responses.lifecycles.LOSS_LEASE_S`) and their shutdown."""
    reasons = failed(LONG_LEASE, "etcd_loss-completion-stream-tcp", tmp_path, records)
    assert f"still ran {LOSS_LEASE_S + discovery_plane.EXIT_S:g} s after etcd was lost" in (reasons)


class OneMember(MockerBackend):
    """Every process told of the first etcd member alone: the one they hold connections to, and
    so the one the case kills (`discovery_plane.most_connected`)."""

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        return replace(launch, env={**launch.env, "ETCD_ENDPOINTS": self.first})


@NEEDS_ETCD
def test_a_deployment_that_knows_one_member_of_three_fails_when_it_is_lost(
    tmp_path, records, monkeypatch
):
    backend = OneMember()
    started = etcd.Cluster.start

    def start(cluster):
        backend.first = cluster.members[0].client_url
        started(cluster)

    monkeypatch.setattr(etcd.Cluster, "start", start)
    monkeypatch.setattr(Pool, "frontend_env", lambda pool: {"ETCD_ENDPOINTS": backend.first})
    reasons = failed(backend, "etcd_member_loss-completion-unary-tcp", tmp_path, records)
    # The frontend ends itself at its lease's deadline: during the watch of new requests, or
    # before it when the response was judged late (a loaded machine).
    assert "after one etcd member was lost" in reasons or (
        "the frontend stopped answering mid-case" in reasons and "its process exited" in reasons
    )


def test_without_etcd_its_cases_are_not_run_and_the_rest_run(tmp_path):
    cases = [
        "aggregate/max_seq_len_not_exceeded-worker_failure-completion-unary-nats",
        "discovery/lease_expiry-chat-stream-tcp",
        "discovery/etcd_loss-completion-stream-tcp",
    ]
    done = run_without("etcd", cases, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert not_run(done) == [
        "handoff: 2 etcd cases not run: etcd is not installed: apt-get install etcd-server (as "
        "root), or run on --handoff-discovery file"
    ]
    assert "1 passed" in done.stdout
