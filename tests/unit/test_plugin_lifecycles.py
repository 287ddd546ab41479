"""A plugin's own fault lifecycle in the case model (`cases.allowed`, `cases.plugin_fault`): it
joins the fault axis wherever a kill runs, for the backend that names it only; published ids
keep theirs; a backend that names one no plugin registers, or a case of it where no worker is
killed, is an error that says so."""

from dataclasses import dataclass

import pytest

from handoff import lifecycle
from handoff.cases import Case, allowed, selection
from handoff.errors import HandoffError

OWN = "frozen_forever"


@dataclass
class Runs:
    """A backend as the case model sees it (`cases.Runner`)."""

    lifecycles: tuple[str, ...] = ()
    name: str = "plugin"
    topologies: tuple[str, ...] = ("aggregate", "abandoned")
    restrictions: tuple = ()

    def roles(self, topology_name: str) -> tuple[str, ...]:
        return ("aggregate", "aggregate")


@pytest.fixture
def registered(monkeypatch):
    own = lifecycle.Lifecycle(OWN, "SIGKILL", lambda *_: None)
    monkeypatch.setitem(lifecycle.registered(), OWN, own)


def test_it_joins_the_faults_where_a_kill_runs_for_its_backend_only(registered):
    assert OWN in allowed("aggregate", Runs((OWN,)))["fault"]
    assert OWN not in allowed("aggregate", Runs())["fault"]
    assert OWN not in allowed("abandoned", Runs((OWN,)))["fault"]  # no worker is killed there


def test_its_rows_are_added_and_the_published_ids_kept(registered):
    published = [c.id for c in selection("aggregate", "pre_merge")]
    mine = [c.id for c in selection("aggregate", "pre_merge", Runs((OWN,)))]
    assert mine[: len(published)] == published
    added = [Case.from_id(i) for i in mine[len(published) :]]
    assert added and {c.fault for c in added} == {OWN}


def test_a_case_of_it_where_no_worker_is_killed_is_refused(registered):
    with pytest.raises(HandoffError, match="abandoned cases allow fault"):
        Case("migration_enabled", OWN, "chat", "stream", "nats", "abandoned")


def test_a_lifecycle_no_plugin_registers_is_named_with_the_fix():
    with pytest.raises(HandoffError, match="no installed plugin registers"):
        allowed("aggregate", Runs(("never_installed",)))
    with pytest.raises(HandoffError, match="unknown fault 'never_installed'"):
        Case("migration_enabled", "never_installed", "chat", "stream", "nats")


def test_an_unheard_one_runs_where_a_stall_does_and_one_off_the_path_nowhere(monkeypatch):
    unheard = lifecycle.Lifecycle(OWN, "SIGSTOP", lambda *_: None, meets=lifecycle.UNHEARD)
    monkeypatch.setitem(lifecycle.registered(), OWN, unheard)
    assert OWN in allowed("aggregate", Runs((OWN,)))["fault"]
    assert OWN not in allowed("join", Runs((OWN,)))["fault"]  # a worker replaced: kills only
    off = lifecycle.Lifecycle(OWN, "SIGSTOP", lambda *_: None, meets=lifecycle.OFF_PATH)
    monkeypatch.setitem(lifecycle.registered(), OWN, off)
    with pytest.raises(HandoffError, match="may strike a worker only"):
        allowed("aggregate", Runs((OWN,)))
