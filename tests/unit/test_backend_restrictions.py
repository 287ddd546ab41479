"""A backend that cannot run some axis values: those rows are not generated, the published
rows it can run keep their ids, and the fewest added rows keep the topology's promise."""

import pytest

from handoff.backend import Backend
from handoff.cases import TOPOLOGIES, Restriction, promise, selection, unmet
from handoff.covering.verify import complete, pairs_of, product_rows

NO_DRAIN = Restriction("fault", ("worker_failure",), "this engine cannot drain")


class NoGracefulShutdown(Backend):
    name = "no-drain"
    version = "0"
    topologies = {
        t: ("aggregate", "aggregate") for t in ("aggregate", "decode", "kv_transfer", "load")
    }
    restrictions = (NO_DRAIN,)

    def check_environment(self): ...
    def prepare_model(self, folder): ...
    def shape(self, case): ...
    def worker(self, role, case, model, ports, folder): ...


@pytest.mark.parametrize("name", ["aggregate", "decode", "kv_transfer", "load"])
@pytest.mark.parametrize("chosen", ["pre_merge", "nightly"])
def test_restricted_rows_are_never_generated_and_the_promise_holds(name, chosen):
    backend = NoGracefulShutdown()
    cases = selection(name, chosen, backend)
    assert cases and all(c.fault == "worker_failure" for c in cases)
    assert unmet(name, cases, promise(name, chosen), backend) == []


def test_published_rows_keep_their_ids_and_added_rows_come_after():
    cases = selection("aggregate", "pre_merge", NoGracefulShutdown())
    published = [i for i in TOPOLOGIES["aggregate"].pre_merge_ids if "worker_failure" in i]
    assert [c.id for c in cases[: len(published)]] == published
    # 4 policies x 2 apis need 8 rows once the fault is fixed: the lower bound, reached.
    assert len(cases) == 8


def test_removing_any_added_row_breaks_the_promise():
    backend = NoGracefulShutdown()
    cases = list(selection("aggregate", "pre_merge", backend))
    kept = promise("aggregate", "pre_merge")
    for i in range(4, len(cases)):
        assert unmet("aggregate", cases[:i] + cases[i + 1 :], kept, backend)


def test_complete_covers_every_pair_the_candidates_hold_and_nothing_when_covered():
    axes = {"a": ("0", "1", "2"), "b": ("0", "1"), "c": ("0", "1")}
    candidates = product_rows(axes)
    added = complete([], candidates, tuple(axes))
    assert pairs_of(tuple(axes), added) == pairs_of(tuple(axes), candidates)
    assert complete(candidates, candidates, tuple(axes)) == []
    assert complete([], candidates, tuple(axes)) == added  # deterministic
