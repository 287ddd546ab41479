"""The discovery setting and its pieces: which instance ids a worker registered (the file store
and etcd alike), the layout a case's pool gets, the data folders of a killed run reaped, and a
real etcd member read, written and removed through its gateway."""

import json
import subprocess
import sys

import pytest
import requests

from handoff import faults, lifecycle
from handoff.cases import Case, topology
from handoff.machine import etcd, ownership, registrations
from handoff.machine.discovery import FILE, EtcdDiscovery, Layout
from handoff.machine.polling import Deadline
from handoff.machine.ports import PortLeases
from handoff.machine.processes import ManagedProcess
from handoff.settings import problem

AGGREGATE = Case.from_id("migration_enabled-worker_failure-chat-stream-tcp")
CARD = {"instance_id": 0x390DA24B2168CA05, "card_json": {"path": "http://127.0.0.1:28081/x"}}


def test_a_worker_is_known_by_its_card_once_its_endpoint_is_registered_too():
    assert registrations.served_from([CARD], set(), 28081) == set()
    assert registrations.served_from([CARD], {"390da24b2168ca05"}, 28081) == {CARD["instance_id"]}
    assert registrations.served_from([CARD], {"390da24b2168ca05"}, 28082) == set()


@pytest.mark.parametrize(
    ("case", "chosen", "layout"),
    [
        (Case.from_id("migration_enabled-worker_failure-chat-stream-tcp"), "file", FILE),
        (
            Case.from_id("migration_enabled-worker_failure-chat-stream-tcp"),
            "etcd",
            Layout("etcd", 1),
        ),
        (Case.from_id("lease_expiry-chat-stream-tcp", "discovery"), "file", Layout("etcd", 1)),
        (Case.from_id("etcd_member_loss-chat-stream-tcp", "discovery"), "file", Layout("etcd", 3)),
        (
            Case.from_id("etcd_partition-chat-stream-tcp", "discovery"),
            "file",
            Layout("etcd", 3, pinned=True),
        ),
    ],
)
def test_the_discovery_cases_run_on_etcd_whatever_was_chosen(case, chosen, layout):
    on_etcd = topology(case.topology).on_etcd
    assert lifecycle.layout(case.fault, chosen, on_etcd) == layout


def test_a_discovery_that_is_none_of_the_two_names_both():
    assert problem("discovery", "consul") == (
        "must be one of file, etcd, not 'consul': give one of them"
    )


def test_a_killed_runs_data_folder_is_reaped_and_a_live_ones_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv(ownership.STATE_ENV, str(tmp_path))
    mine = ownership.own_folder("etcd-1")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    orphan = tmp_path / "folders" / "etcd-2-x"
    orphan.mkdir()
    record = {"folder": str(orphan), "owner": int(dead.stdout), "owner_started": 1.0}
    orphan.with_name(orphan.name + ".json").write_text(json.dumps(record))
    assert ownership.reap_folders() == [f"data folder {orphan} (owner pid {dead.stdout.strip()})"]
    assert not orphan.exists() and mine.is_dir()
    ownership.drop_folder(mine)
    assert list((tmp_path / "folders").iterdir()) == []


@pytest.mark.skipif(bool(etcd.missing()), reason=str(etcd.missing()))
def test_a_member_is_read_written_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(ownership.STATE_ENV, str(tmp_path / "records"))
    leases, processes = PortLeases(), []

    def spawn(name: str, argv: list[str]) -> ManagedProcess:
        processes.append(ManagedProcess(name, argv, {}, tmp_path / f"{name}.log"))
        processes[-1].start()
        return processes[-1]

    cluster = etcd.Cluster(etcd.members(leases.take, 1), spawn)
    try:
        cluster.start()
        cluster.wait_ready(Deadline(30))
        url = cluster.members[0].client_url
        lease = int(
            requests.post(f"{url}/v3/lease/grant", json={"TTL": 30}, timeout=5).json()["ID"]
        )
        key = "v1/instances/dynamo/backend/generate/390da24b2168ca05"
        body = {"key": etcd._b64(key), "value": etcd._b64("{}"), "lease": lease}
        requests.post(f"{url}/v3/kv/put", json=body, timeout=5).raise_for_status()
        assert cluster.entries("v1/instances/") == {key: (b"{}", lease)}
        assert cluster.entries("v1/mdc/") == {}
        assert EtcdDiscovery(cluster).remove({lease}) == [f"lease {lease:x}"]
        assert cluster.entries("v1/instances/") == {} and cluster.time_to_live(lease) is None
        assert EtcdDiscovery(cluster).remove({lease}) == []  # ended: nothing to remove
    finally:
        for process in processes:
            process.kill()
            process.wait_gone(Deadline(10))
        leases.release()
    data = cluster.members[0].data
    cluster.remove_data()
    assert data is not None and not data.exists()
    assert list((tmp_path / "records" / "folders").iterdir()) == []
    with pytest.raises(etcd.Unanswered):
        cluster.entries("v1/")


def test_a_partition_spares_the_etcd_members_a_worker_was_told_of():
    """The partition cuts a worker off from the frontend and the broker on either discovery;
    its cut from etcd is etcd_partition's."""
    told = {"ETCD_ENDPOINTS": "http://127.0.0.1:23001,http://127.0.0.1:23003"}
    assert faults.etcd_ports(told) == {23001, 23003}
    assert faults.etcd_ports({}) == set()
