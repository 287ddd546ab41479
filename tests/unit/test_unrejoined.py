"""What a failed rejoin says, on listings this test gives: the healed holder alone, or first
the never-faulted workers the frontend dropped too (leases lost beyond the fault); and the
proof that a stall outlived the holder's lease, which an unknown instance id never gives."""

import time
from types import SimpleNamespace

import pytest
import requests

from handoff.deployment import Deployment
from handoff.errors import CaseFailure
from handoff.history import History
from handoff.machine.polling import Timeout
from handoff.responses.recovery import JOINED, await_unlisted, unrejoined

HOLDER, BYSTANDER, UNREGISTERED = "worker-1-aggregate", "worker-0-aggregate", "worker-2-aggregate"
TIMEOUT = Timeout("timed out waiting for worker-1-aggregate to take a request again")


def deployment(listed: set[int] | None) -> Deployment:
    """A deployment of three workers, one not yet registered, whose frontend lists `listed`
    (None: it does not answer)."""
    shown = object.__new__(Deployment)
    shown.workers = [SimpleNamespace(name=n) for n in (BYSTANDER, HOLDER, UNREGISTERED)]
    shown.pool = SimpleNamespace(instance_ids={BYSTANDER: {10}, HOLDER: {11}})
    shown.readings = 0

    def listing():
        shown.readings += 1
        if listed is None:
            raise requests.ConnectionError("refused")
        return {("backend", "generate"): listed}, ["handoff-mocker"]

    shown.listing = listing
    return shown


def holder() -> SimpleNamespace:
    """A holder still running."""
    return SimpleNamespace(name=HOLDER, process=SimpleNamespace(exit_code=lambda: None))


def test_a_holder_never_served_while_every_worker_is_listed_is_the_holders_failure():
    said = unrejoined(deployment({10, 11}), holder(), TIMEOUT)
    assert said.startswith(
        f"{HOLDER}, healed after its fault, was never routed to again (it still runs): timed"
    )
    assert said.endswith("the frontend lists instances {'backend/generate': 2} and models "
                         "['handoff-mocker']")  # fmt: skip


def test_a_dropped_bystander_is_named_first_as_leases_lost_beyond_the_fault():
    shown = deployment({11})
    said = unrejoined(shown, holder(), TIMEOUT)
    assert shown.readings == 1  # what is named and what is shown: one reading, never two
    assert said.startswith(f"the frontend dropped {BYSTANDER}, never faulted: the deployment lost")
    assert f"{HOLDER}'s own rejoin is not what this judged; {HOLDER}, healed after" in said
    assert said.endswith(f"; it lists none of {BYSTANDER}")


def test_the_worker_a_joiner_replaced_is_no_bystander_but_any_other_is():
    """A joiner's probes: the worker its case ended is unlisted, rightly, and not blamed; one
    the case never faulted and the frontend dropped is, first."""
    said = unrejoined(deployment({11}), holder(), TIMEOUT, JOINED, ended=(BYSTANDER,))
    assert said.startswith(f"{HOLDER}, {JOINED}, never took a request (it still runs): timed out")
    said = unrejoined(deployment({11}), holder(), TIMEOUT, JOINED, ended=("worker-9-aggregate",))
    assert said.startswith(f"the frontend dropped {BYSTANDER}, never faulted")


@pytest.mark.parametrize(
    ("listed", "view"),
    [
        ({10}, f"; it lists none of {HOLDER}"),
        (None, "the frontend does not answer /health (ConnectionError)"),
    ],
)
def test_the_holder_dropped_alone_or_a_silent_frontend_blames_no_bystander(listed, view):
    said = unrejoined(deployment(listed), holder(), TIMEOUT)
    assert said.startswith(f"{HOLDER}, healed after its fault") and said.endswith(view)
    assert UNREGISTERED not in said  # no known instance: never called unlisted


def test_a_holder_without_a_known_instance_id_never_counts_as_having_left_discovery():
    shown = deployment(set())  # the frontend lists nothing at all
    shown.pool.instance_ids.pop(HOLDER)
    stranger = SimpleNamespace(name=UNREGISTERED)
    with pytest.raises(CaseFailure, match=f"no instance id of {UNREGISTERED} is known"):
        await_unlisted(shown, stranger, time.monotonic(), History())


def test_a_holder_the_frontend_no_longer_lists_has_left_discovery():
    history = History()
    await_unlisted(deployment({10}), holder(), time.monotonic(), history)
    assert [e.name for e in history.events] == ["worker_unlisted"]
