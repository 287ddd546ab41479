"""A third-party backend as small as one can be: its own name, version and facts, launching
the mocker underneath. It runs aggregate cases only, the two faults that end a worker and a
lifecycle of its own (`lifecycle.py`) only, and counts migrations as a lower bound."""

from importlib.metadata import version

from handoff.cases import KILLS, Restriction
from handoff.plugins import hookimpl
from handoff_example.lifecycle import NAME
from handoff_mocker import TIMINGS, MockerBackend

ONLY_AGGREGATE = "the example engine has no disaggregated mode"


class ExampleBackend(MockerBackend):
    name = "example"
    version = version("handoff-example")
    topologies = {"aggregate": ("aggregate", "aggregate")}
    unsupported = {t: ONLY_AGGREGATE for t in ("decode", "kv_transfer", "prefill")}
    lifecycles = (NAME,)
    restrictions = (
        Restriction(
            "fault",
            (*KILLS, NAME),
            "the example engine has qualified its kills and its own lifecycle only",
        ),
    )
    migration_counts = "lower_bound"

    def timing(self, case):
        """Its own lifecycle is made on a held holder, as a kill: timed as one."""
        fault = "worker_failure" if case.fault == NAME else case.fault
        return TIMINGS[(case.topology, fault)]


@hookimpl
def register_backends(register):
    register(ExampleBackend())
