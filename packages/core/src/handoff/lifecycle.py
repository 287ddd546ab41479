"""A fault lifecycle: one fault as a value that owns all it does, from the environment it
needs to the aftermath it leaves, so that the exercise never asks a fault's name.

Core's own lifecycles (`handoff.responses.lifecycles`) and a plugin's are found the same way:
through the `handoff.lifecycles` entry point group, whose modules implement
`register_lifecycles`. A stage is handed the case's context whole (`responses.waits.CaseRun`),
and the holder and what it must land before where it acts on them."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any

import pluggy

from handoff.errors import HandoffError
from handoff.machine import etcd
from handoff.machine.discovery import FILE, Layout

GROUP = "handoff.lifecycles"
hookspec = pluggy.HookspecMarker("handoff")
hookimpl = pluggy.HookimplMarker("handoff")

#: How a fault meets the response in flight (`policies.expected_outcome`): its holder ends or
#: drains, and the policy decides (MOVES); its holder goes silent, and only the frontend's
#: stream timeout notices (UNHEARD); the fault is off the response's path (the broker, etcd, a
#: lease), which completes where it is and is never moved (OFF_PATH); or the client leaves, and
#: the lifecycle's own `outcome` holds (LEAVES).
MOVES, UNHEARD, OFF_PATH, LEAVES = "moves", "unheard", "off_path", "leaves"


def _nothing(*_: object) -> None:
    return None


def _no_problems(*_: object) -> list[str]:
    return []


def _no_env(*_: object) -> dict[str, str]:
    return {}


def _no_wait(*_: object) -> tuple[float, str]:
    return 0.0, ""


@dataclass(frozen=True)
class Lifecycle:
    """One fault from its environment to its aftermath. Every stage is a callable, so a
    plugin's lifecycle composes handoff's own primitives (`handoff.faults`,
    `handoff.responses.recovery`) as core's do."""

    name: str
    #: The signal (or the act) the fault starts with, as the history tells it.
    first_signal: str
    #: (run, holder, watched, aimed) -> faults.FaultReport: the fault, made while the request
    #: is provably in its window (`faults.hold`, or with its room: `runs_on`); None where no
    #: worker is faulted (a client that leaves mid-stream).
    inject: Callable[..., Any] | None
    #: (run, holder) -> the process the fault signals (a ManagedProcess), as the history
    #: names it: by default the holder's.
    target: Callable[..., Any] = lambda _run, holder: holder.process
    #: (run, holder, report) -> None: what the fault left, in the history; a worker it ended
    #: replaced, as a real deployment's would be.
    left: Callable[..., None] = _nothing
    #: (struck: responses.recovery.Struck) -> problems: what it must leave once every
    #: response has ended, beyond every gauge at 0 (which the workload checks after it): a
    #: healed worker serving again, the broker's recovery, the discovery plane's.
    aftermath: Callable[..., list[str]] = _no_problems
    #: Every gauge must read 0 after the aftermath (`recovery.idle_problems`). False only for a
    #: fault whose aftermath may end the frontend itself, which then reads the gauges itself
    #: where the frontend still serves (etcd lost or restarted).
    idle_after: bool = True
    #: How it meets the response (MOVES, UNHEARD, OFF_PATH, LEAVES).
    meets: str = MOVES
    #: (settings) -> (seconds, why): how long the frontend may rightly wait after it before
    #: the request has moved, the request plane's timeout aside.
    wait: Callable[..., tuple[float, str]] = _no_wait
    #: (settings) -> seconds the holder runs on after the first signal, which the request must
    #: outlast (`faults.require_room`); None for a fault made on a held holder.
    runs_on: Callable[..., float | None] = _nothing
    #: The holder is stopped (SIGSTOP) until healed: in a race it runs again at the move.
    stops_holder: bool = False
    #: The stall lasts until the frontend no longer lists the holder (its lease ran out).
    outlives_lease: bool = False
    #: The lifecycle a stall becomes where it outlives the holder's lease all the same (a load
    #: case's long stream timeout), whose known defect it then meets.
    past_lease: str | None = None
    #: Healed while the response is awaited, once its move is seen (`recovery.Heal`); else
    #: only in the aftermath.
    heals_on_move: bool = False
    #: Its workers' pool tag and environment beyond the backend's launch.
    worker_env: tuple[str, Mapping[str, str]] | None = None
    #: (settings) -> the frontend's environment that bounds its wait.
    frontend_env: Callable[..., dict[str, str]] = _no_env
    #: Where its workers register; None: where the run chose.
    layout: Layout | None = None
    #: () -> why it cannot run on this machine, with the fix; None when it can.
    missing: Callable[[], str | None] = _nothing
    #: (deployment) -> the etcd members it kills, chosen before the request is sent.
    aim: Callable[..., list[Any]] = lambda _deployment: []
    #: LEAVES: the client leaves only once the request's successor streams it.
    leaves_once_moved: bool = False
    #: LEAVES: what the frontend must count (`policies.Outcome`).
    outcome: Any = None

    @property
    def silent(self) -> bool:
        return self.meets == UNHEARD


@hookspec
def register_lifecycles(register: Callable[[Lifecycle], None]) -> None:
    """Called once when lifecycles load; call `register(lifecycle)` for each you provide. A
    name must be unique across installed plugins."""


@cache
def registered() -> dict[str, Lifecycle]:
    """Every lifecycle installed, by name, loaded once. A plugin that fails to load, or names
    a lifecycle twice, is an error that names it: a fault it defines could not be qualified."""
    pm = pluggy.PluginManager("handoff")
    pm.add_hookspecs(sys.modules[__name__])
    found: dict[str, Lifecycle] = {}

    def register(lifecycle: Lifecycle) -> None:
        if not isinstance(lifecycle, Lifecycle):
            raise HandoffError(f"{lifecycle!r} is not a handoff.lifecycle.Lifecycle")
        if lifecycle.name in found:
            raise HandoffError(f"two lifecycles are called {lifecycle.name!r}: rename one")
        found[lifecycle.name] = lifecycle

    for ep in entry_points(group=GROUP):
        try:
            pm.register(ep.load(), name=f"lifecycles-{ep.name}")
        except Exception as exc:
            raise HandoffError(
                f"the {GROUP} entry point {ep.name!r} failed to load: {exc}"
            ) from exc
    pm.hook.register_lifecycles(register=register)
    return found


def of(name: str) -> Lifecycle:
    """The lifecycle of fault `name`."""
    try:
        return registered()[name]
    except KeyError:
        if not registered():  # handoff's own come through its entry point too
            raise HandoffError(
                f"no fault lifecycle is installed, not even handoff's own ({GROUP}): reinstall "
                f"handoff (pip install -e packages/core) so that its entry points are recorded"
            ) from None
        known = ", ".join(sorted(registered()))
        raise HandoffError(
            f"no lifecycle is installed for fault {name!r} (installed: {known}): install the "
            f"plugin that provides it"
        ) from None


def layout(fault: str, chosen: str, on_etcd: bool = False) -> Layout:
    """Where a case of `fault` has its workers register: its lifecycle's own layout (the
    discovery plane's faults: etcd, of one member or three), else etcd of one member where its
    topology qualifies the discovery plane (`on_etcd`), else the `chosen` discovery."""
    if own := of(fault).layout:
        return own
    return FILE if chosen == "file" and not on_etcd else Layout("etcd", 1)


def missing(fault: str, chosen: str, on_etcd: bool = False) -> tuple[str, str] | None:
    """What a case of `fault` cannot run without on this machine, and why, in one line that
    says the fix; None when it can: its lifecycle's own needs, then etcd where it registers
    there."""
    if why := of(fault).missing():
        return fault, why
    if layout(fault, chosen, on_etcd).kind == "etcd" and (why := etcd.missing()):
        return "etcd", why
    return None
