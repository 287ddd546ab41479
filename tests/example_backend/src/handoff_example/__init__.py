"""A third-party backend as small as one can be: its own name, version and facts, launching
the mocker underneath. It runs aggregate cases only, the two faults that end a worker only,
and counts migrations as a lower bound."""

from importlib.metadata import version

from handoff.cases import KILLS, Restriction
from handoff.plugins import hookimpl
from handoff_mocker import MockerBackend

ONLY_AGGREGATE = "the example engine has no disaggregated mode"


class ExampleBackend(MockerBackend):
    name = "example"
    version = version("handoff-example")
    topologies = {"aggregate": ("aggregate", "aggregate")}
    unsupported = {t: ONLY_AGGREGATE for t in ("decode", "kv_transfer", "prefill")}
    restrictions = (
        Restriction("fault", KILLS, "the example engine has not qualified its hangs yet"),
    )
    migration_counts = "lower_bound"


@hookimpl
def register_backends(register):
    register(ExampleBackend())
