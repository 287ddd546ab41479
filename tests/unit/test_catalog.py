"""What `handoff cases` tells a user to run, and the defect the reference expects of a case:
the session a backend names exists, a subclass is never run by its parent's session, and a
load's stall is expected to meet the lease's defect only where a run sizes it past the lease."""

import re
from dataclasses import replace
from pathlib import Path

from handoff_example import ExampleBackend

from handoff import cli, lifecycle, releases
from handoff.cases import Case
from handoff.commands.catalog import AT_RUN, expected, run_by
from handoff.policies import KNOWN_DEFECTS, past_lease_defect
from handoff_mocker import MockerBackend
from handoff_sglang import SglangBackend
from handoff_trtllm import TrtllmBackend
from handoff_vllm import VllmBackend

NOXFILE = (Path(__file__).resolve().parents[2] / "noxfile.py").read_text()


def test_each_session_a_backend_names_is_in_the_noxfile_for_a_device_it_has():
    for backend in (MockerBackend, VllmBackend, SglangBackend, TrtllmBackend):
        assert backend.sessions, backend.name
        assert set(backend.sessions) <= (set(backend.devices) or {""}), backend.name
        for session in backend.sessions.values():
            assert re.search(rf"^def {session}\(", NOXFILE, re.M), session


def test_the_session_runs_another_selection_when_told():
    mocker = MockerBackend()
    assert run_by(mocker, "pre_merge") == "nox -s mocker_pre_merge"
    assert run_by(mocker, "nightly") == "nox -s mocker_pre_merge -- --handoff-selection nightly"


def test_a_subclass_is_run_by_the_plugin_not_by_its_parents_session():
    assert ExampleBackend.sessions == {}
    assert run_by(ExampleBackend(), "full") == (
        "pytest --pyargs handoff.qualification --handoff-backend example --handoff-selection full"
    )


def test_a_loads_stall_meets_the_lease_defect_only_at_run():
    stall = Case.from_id("migration_enabled-worker_stall-chat-nats", "load")
    assert expected(stall) == (KNOWN_DEFECTS["stall_past_lease"], AT_RUN)
    single = Case.from_id("migration_enabled-worker_stall-chat-stream-nats")
    assert expected(single) == (None, "")
    drained = Case.from_id("migration_enabled-drain_expired-chat-stream-nats")
    assert expected(drained) == (KNOWN_DEFECTS["drain_expired"], "")


def test_the_reference_refuses_a_narrowing_it_would_ignore(capsys):
    assert cli.main(["cases", "--markdown", "--backend", "mocker", "--topology", "load"]) == 2
    assert "drop --device, --topology and --selection" in capsys.readouterr().err


def test_a_release_that_fixed_the_lease_expects_no_defect_of_a_loads_stall(monkeypatch):
    fixed = replace(releases.current(), fixed=frozenset({"Dynamo issue 3493"}))
    monkeypatch.setattr(releases, "current", lambda: fixed)
    stall = Case.from_id("migration_enabled-worker_stall-chat-nats", "load")
    assert expected(stall) == (None, "")
    assert past_lease_defect(lifecycle.of("worker_stall")) is None  # what the load case meets
