"""A backend runs only the topologies it declares; for the others it says why."""

import pytest

from handoff import cli
from handoff.backend import Backend
from handoff.cases import backend_cases
from handoff.errors import HandoffError


class AggregateOnly(Backend):
    """Declares aggregate only and gives a reason for prefill; says nothing of the rest."""

    name = "aggregate-only"
    version = "0"
    topologies = {"aggregate": ("aggregate", "aggregate")}
    unsupported = {"prefill": "this engine cannot migrate a request out of prefill"}

    def check_environment(self): ...
    def prepare_model(self, folder): ...
    def shape(self, case): ...
    def worker(self, role, case, model, ports, folder): ...


def test_only_declared_topologies_produce_cases():
    cases = backend_cases(AggregateOnly(), None, "pre_merge")
    assert {c.topology for c in cases} == {"aggregate"} and len(cases) == 30


@pytest.mark.parametrize(
    ("topology", "why"),
    [
        ("prefill", "this engine cannot migrate a request out of prefill"),
        ("decode", "not declared by the backend"),
    ],
)
def test_asking_for_an_unsupported_topology_says_why(topology, why):
    with pytest.raises(HandoffError, match=f"does not run {topology} cases: {why}"):
        backend_cases(AggregateOnly(), [topology], "pre_merge")


def test_handoff_cases_shows_the_reason(monkeypatch, capsys):
    monkeypatch.setattr(cli, "configured_backend", lambda name, overrides=None: AggregateOnly())
    assert cli.main(["cases", "--backend", "aggregate-only"]) == 0
    out = capsys.readouterr().out
    assert "# prefill: not run by aggregate-only: this engine cannot migrate" in out
    assert "# decode: not run by aggregate-only: not declared by the backend" in out
    assert out.count("\n") == 2 + 1 + 30 + 21  # run by, header, ids, skipped
