"""A worker's entries in a file discovery store, laid out as Dynamo 1.6.1 writes them (the
same layout runs for real in tests/e2e/test_pools.py)."""

import json

from handoff.machine import registrations

GENERATE = 6832280171663054764  # 0x5ed1229dfdebd7ac
OTHER = 11119683189519215782  # 0x9a510cf23e2ceca6
PUBLISHER = "1b9e2c33004fe5"


def write(store, kind, name, value):
    path = store / "v1" / kind / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return path


def card(instance, port):
    source = f"http://127.0.0.1:{port}/v1/metadata/dynamo/config.json"
    return {"type": "Model", "instance_id": instance, "card_json": {"path": source}}


def two_workers(store):
    """A decode worker on system port 28923 with a KV publisher, and another on 22426."""
    mine = [
        write(
            store, "mdc", "dynamo%2Fbackend%2Fgenerate%2F5ed1229dfdebd7ac", card(GENERATE, 28923)
        ),
        write(store, "instances", "dynamo%2Fbackend%2Fgenerate%2F5ed1229dfdebd7ac", {}),
        write(
            store,
            "instances",
            f"dynamo%2Fbackend%2Fworker%5Fkv%5Fquery%5Fsource%5F{PUBLISHER}%2F5ed1229dfdebd7ac",
            {"endpoint": f"worker_kv_query_source_{PUBLISHER}", "instance_id": GENERATE},
        ),
        write(store, "event_channels", f"ns%2Ftopic%2Fkv%2Devents%2F{PUBLISHER}", {}),
        write(store, "event_sources", f"ns%2Ftopic%2Fkv%2Devents%2F{PUBLISHER}", {}),
    ]
    theirs = [
        write(store, "mdc", "dynamo%2Fbackend%2Fgenerate%2F9a510cf23e2ceca6", card(OTHER, 22426)),
        write(store, "instances", "dynamo%2Fbackend%2Fgenerate%2F9a510cf23e2ceca6", {}),
        write(store, "event_channels", "ns%2Ftopic%2Fkv%5Fmetrics%2Fed4c0eef67a", {}),
    ]
    return mine, theirs


def test_a_worker_is_known_by_the_system_port_its_card_is_served_from(tmp_path):
    two_workers(tmp_path)
    assert registrations.instance_ids(tmp_path, 28923) == {GENERATE}
    assert registrations.instance_ids(tmp_path, 22426) == {OTHER}
    assert registrations.instance_ids(tmp_path, 2892) == set()  # a prefix of a port is not it


def test_a_store_not_written_yet_holds_no_worker(tmp_path):
    assert registrations.instance_ids(tmp_path / "discovery", 28923) == set()


def test_removing_a_worker_takes_its_entries_and_only_its(tmp_path):
    mine, theirs = two_workers(tmp_path)
    removed = registrations.remove(tmp_path, {GENERATE})
    assert sorted(removed) == sorted(str(p.relative_to(tmp_path)) for p in mine)
    assert not any(p.exists() for p in mine)
    assert all(p.exists() for p in theirs)


def test_a_worker_with_a_card_but_no_endpoint_yet_is_not_registered(tmp_path):
    """vLLM writes its model card first: a frontend would not list it yet."""
    write(tmp_path, "mdc", "dynamo%2Fbackend%2Fgenerate%2F5ed1229dfdebd7ac", card(GENERATE, 28923))
    assert registrations.instance_ids(tmp_path, 28923) == set()
    write(tmp_path, "instances", "dynamo%2Fbackend%2Fgenerate%2F5ed1229dfdebd7ac", {})
    assert registrations.instance_ids(tmp_path, 28923) == {GENERATE}


def rewrite(path, value):
    """As Dynamo rewrites an entry: a temporary file renamed over it (a new inode)."""
    temp = path.with_name(".tmp_0123456789abcdef")
    temp.write_text(json.dumps(value))
    temp.replace(path)


def test_a_mirror_keeps_a_workers_own_folder_true_in_the_shared_store(tmp_path):
    own, store = tmp_path / "own", tmp_path / "store"
    entry = write(own, "mdc", "dynamo%2Fbackend%2Fgenerate%2F5ed1229dfdebd7ac", card(GENERATE, 1))
    (entry.parent / ".tmp_fedcba9876543210").write_text("half")  # Dynamo's write in the making
    mirror = registrations.Mirror(own, store)
    mirror.sync()
    shared = store / entry.relative_to(own)
    assert shared.stat().st_ino == entry.stat().st_ino  # the keep-alive freshens both
    assert [p.name for p in shared.parent.iterdir()] == [shared.name]  # no temporary file

    rewrite(entry, card(GENERATE, 2))
    mirror.sync()
    assert shared.stat().st_ino == entry.stat().st_ino
    assert json.loads(shared.read_text()) == card(GENERATE, 2)

    entry.unlink()  # a drained worker deletes its own entries
    mirror.sync()
    assert not shared.exists()


def test_a_mirror_leaves_gone_what_the_shared_store_expired_and_what_another_wrote(tmp_path):
    own, store = tmp_path / "own", tmp_path / "store"
    first = write(own, "instances", "a%2F5ed1229dfdebd7ac", {})
    second = write(own, "instances", "b%2F5ed1229dfdebd7ac", {})
    mirror = registrations.Mirror(own, store)
    mirror.sync()
    (store / first.relative_to(own)).unlink()  # expired there: untouched for the lease
    other = store / second.relative_to(own)
    other.unlink()
    other.write_text("{}")  # another writer's entry by that name since
    second.unlink()
    mirror.sync()
    assert not (store / first.relative_to(own)).exists()
    assert other.exists()
