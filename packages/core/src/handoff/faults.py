"""Finding the worker that holds the request, proving it is in flight, and faulting it."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import psutil

from handoff.backend import Backend, Worker
from handoff.cases import BROKER, DISCOVERY_PLANE, ENGINE, STALLS, Case
from handoff.client import InFlight
from handoff.errors import CaseFailure, HandoffError
from handoff.machine import etcd, firewall
from handoff.machine.discovery import FILE, Layout
from handoff.machine.processes import ManagedProcess
from handoff.metrics import Unanswered, once_answered
from handoff.polling import Deadline, poll_until

HOLDER_TIMEOUT_S = 30.0
#: The signal each fault starts with.
FIRST_SIGNAL = {
    "worker_failure": "SIGKILL",
    "graceful_shutdown": "SIGTERM",
    "worker_stall": "SIGSTOP",
    "drain_expired": "SIGTERM",
    "partition": "nftables drop",
    "broker_stall": "SIGSTOP",
    "broker_loss": "SIGKILL",
    "stall_past_lease": "SIGSTOP",
    "engine_failure": "SIGKILL",
    "lease_expiry": "SIGKILL",
    "lease_revoked": "lease revoke",
    "etcd_partition": "nftables drop",
    "etcd_member_loss": "SIGKILL",
    "etcd_restart": "SIGKILL",
    "etcd_loss": "SIGKILL",
}
#: How long a partition's rules may take to drop their first packet: the holder streams its
#: tokens on, so only rules that missed its connections drop nothing.
CUT_PROOF_S = 10.0
#: The least time over which a response's rate is measured before its rest is judged by it.
RATE_WINDOW_S = 0.5
#: drain_expired: the drained worker's own drain timeout, shorter than the rest of any such
#: case's request; after it, the worker must exit on its own within DRAIN_EXIT_S.
DRAIN_TIMEOUT_S = 1
DRAIN_EXIT_S = 15.0
#: What a fault needs of the workers of its pool beyond the backend's launch: a tag for the
#: pool's key (its workers are not interchangeable with others') and their environment.
WORKER_ENV = {
    "drain_expired": (
        f"drain{DRAIN_TIMEOUT_S}s",
        {"DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS": str(DRAIN_TIMEOUT_S)},
    ),
    # Dynamo's engine monitor asks the engine's health every 2 s and gives each answer 30 s,
    # then its shutdown 60 s: shorter here, so that a worker that never notices its engine's
    # death is told apart within ENGINE_EXIT_S rather than 92 s.
    "engine_failure": (
        "engine10s",
        {"DYN_ENGINE_HEALTH_CHECK_TIMEOUT": "10", "DYN_ENGINE_HEALTH_SHUTDOWN_TIMEOUT": "10"},
    ),
}
#: engine_failure: how long the worker may take to notice its engine's death by its engine
#: monitor alone (one 2 s interval and one check's timeout, WORKER_ENV), where no request of
#: its raised it first; and the longest it may take to exit by itself: that, the engine's
#: shutdown (WORKER_ENV) and the process's own exit.
ENGINE_NOTICE_S = 2.0 + 10.0
ENGINE_EXIT_S = ENGINE_NOTICE_S + 10.0 + 15.0


class Watched(Protocol):
    """What a fault must land before the end of: one response (`InFlight`), or a load case's
    requests on the worker it faults."""

    @property
    def finished(self) -> bool: ...


@dataclass(frozen=True)
class FaultReport:
    """What was sent to whom, and how the worker's tree went away."""

    fault: str
    worker: str
    pid: int
    #: Signals in the order sent; SIGTERM then SIGKILL when the tree outlived the bound.
    signals: tuple[str, ...]
    #: The client's response had already ended when the last signal was sent.
    response_done_at_kill: bool
    #: graceful_shutdown: the worker drained on SIGTERM alone, and the response had ended by
    #: the time it was gone, inside the graceful bound: no forced disconnect ever came.
    finished_in_grace: bool = False
    #: partition: the rules in place until `heal`.
    cut: firewall.Cut | None = field(default=None, compare=False, repr=False)
    #: engine_failure: when the engine core was killed (monotonic), before the worker ended.
    engine_killed_at: float | None = None


def find_holder(
    backend: Backend, workers: list[Worker], inflight: InFlight, deadline: Deadline
) -> Worker:
    """The one worker that reports the request in flight, by its own state; never a guess: while
    any worker does not answer, another may hold it too, so the search goes on."""

    def probe() -> tuple[Worker | None, str]:
        if inflight.finished:
            raise CaseFailure(
                f"missed the fault window: the response ended before any worker reported it "
                f"in flight: "
                f"{inflight.response.summary()}"
            )
        try:
            holders = backend.holders(workers)
        except Unanswered as exc:
            return None, str(exc)
        if len(holders) > 1:
            names = ", ".join(w.name for w in holders)
            raise CaseFailure(f"more than one worker reports a request in flight: {names}")
        return (holders[0] if holders else None), "no worker reports a request in flight"

    return poll_until(probe, deadline.within(HOLDER_TIMEOUT_S), "a worker to hold the request")


def prove_in_flight(
    backend: Backend,
    holder: Worker,
    inflight: InFlight,
    tokens_seen: Callable[[], int],
    window: str,
    tokens_needed: int,
    what: str,
    deadline: Deadline,
) -> str:
    """Fail the case unless the request is provably in its fault window on `holder`, say how.

    "decoding": wait until `tokens_needed` tokens are out while the response is open.
    "prefill": no token may be out yet. Either way `holder` must still report the request
    (asked until it answers).
    """

    def probe() -> tuple[int | None, str]:
        if inflight.finished:
            raise CaseFailure(
                f"missed the fault window: the response ended before {tokens_needed} {what}: "
                f"{inflight.response.summary()}"
            )
        seen = tokens_seen()
        return (seen if seen >= tokens_needed else None), f"{seen} {what}"

    if window == "prefill":
        seen = tokens_seen()
        if seen:
            raise CaseFailure(
                f"missed the fault window: {seen} {what} before the fault, which must land "
                f"during prefill, before the first token"
            )
    else:
        seen = poll_until(probe, deadline, f"{tokens_needed} {what}")
    still_held = once_answered(
        lambda: holder in backend.holders([holder]),
        deadline.within(HOLDER_TIMEOUT_S),
        f"{holder.name} to say whether it still holds the request",
    )
    if inflight.finished or not still_held:
        raise CaseFailure(
            f"missed the fault window: the request was no longer in flight on {holder.name} "
            f"(worker reports it: {still_held}; response: {inflight.response.summary()})"
        )
    return f"{seen} {what}, response open, {holder.name} reports it in flight"


def await_last_seconds(
    inflight: InFlight,
    tokens_seen: Callable[[], int],
    max_tokens: int,
    seconds: float,
    what: str,
    deadline: Deadline,
) -> str:
    """Wait until the rest of the response, at the rate it has streamed since this call (over
    `RATE_WINDOW_S` at least), takes at most `seconds`; say how far it had got. A response that
    ends first missed its fault window."""
    first, since = tokens_seen(), time.monotonic()

    def probe() -> tuple[str | None, str]:
        if inflight.finished:
            raise CaseFailure(
                f"missed the fault window: the response ended before its last {seconds:g} s: "
                f"{inflight.response.summary()}"
            )
        seen, elapsed = tokens_seen(), time.monotonic() - since
        rate = (seen - first) / elapsed if elapsed >= RATE_WINDOW_S else 0.0
        rest = max_tokens - seen
        state = f"{seen} {what}, {rest} to come at {rate:.0f} tokens/s"
        return (state if rate and rest <= rate * seconds else None), state

    return poll_until(probe, deadline, f"the last {seconds:g} s of the response")


def inject(
    fault: str,
    holder: Worker,
    inflight: Watched,
    graceful_bound_s: float,
    deadline: Deadline,
    broker: ManagedProcess | None = None,
) -> FaultReport:
    """worker_failure: SIGKILL the tree. graceful_shutdown: SIGTERM the parent, then SIGKILL
    whatever is left of the tree once the bound has passed. worker_stall, stall_past_lease:
    SIGSTOP the tree and prove every thread stopped; it stays so until `heal`. drain_expired:
    SIGTERM the parent and wait for the tree to exit by itself once its drain timeout has
    passed. partition: drop
    every packet of the tree's connections (`partition_flows`) and prove the rules dropped
    some; they stay until `heal`. broker_stall, broker_loss: SIGSTOP `broker` (the deployment's
    nats-server) and prove it stopped, or SIGKILL it and wait until it is gone. Whether the
    response had already ended is read just before the last signal goes out."""
    if fault in BROKER:
        assert broker is not None, f"{fault} needs the deployment's nats-server"
        return fault_broker(fault, broker, inflight, deadline.within(HOLDER_TIMEOUT_S))
    if fault in ENGINE:
        return kill_engine(holder, inflight, deadline)
    process = holder.process
    process.tree()  # remember the descendants before the parent can orphan them
    done_before = inflight.finished
    finished_in_grace = False
    if fault in STALLS:
        process.freeze(deadline.within(HOLDER_TIMEOUT_S))
        return FaultReport(fault, holder.name, process.pid, ("SIGSTOP",), done_before)
    if fault == "partition":
        cut = firewall.Cut(partition_flows(holder))  # removed at teardown, whatever happens
        done_before = inflight.finished  # the rules are the signal: in place from here on
        prove_cut(cut, holder, deadline.within(CUT_PROOF_S))
        signals = ("nftables drop",)
        return FaultReport(fault, holder.name, process.pid, signals, done_before, cut=cut)
    if fault == "drain_expired":
        process.signal_tree(signal.SIGTERM, parent_only=True)
        if left := process.wait_gone(deadline.within(DRAIN_TIMEOUT_S + DRAIN_EXIT_S)):
            raise CaseFailure(
                f"{holder.name} was still running {DRAIN_TIMEOUT_S + DRAIN_EXIT_S:g} s after "
                f"SIGTERM, its drain timeout {DRAIN_TIMEOUT_S} s: {left}"
            )
        return FaultReport(fault, holder.name, process.pid, ("SIGTERM",), done_before)
    if fault == "worker_failure":
        process.signal_tree(signal.SIGKILL)
        signals: tuple[str, ...] = ("SIGKILL",)
    else:
        process.signal_tree(signal.SIGTERM, parent_only=True)
        signals = ("SIGTERM",)
        if process.wait_gone(deadline.within(graceful_bound_s)):
            done_before = inflight.finished
            process.signal_tree(signal.SIGKILL)
            signals = ("SIGTERM", "SIGKILL")
        else:
            finished_in_grace = inflight.finished
    left = process.wait_gone(deadline.within(HOLDER_TIMEOUT_S))
    if left:
        raise CaseFailure(f"{holder.name} still alive after {'+'.join(signals)}: {left}")
    return FaultReport(fault, holder.name, process.pid, signals, done_before, finished_in_grace)


def kill_engine(holder: Worker, inflight: Watched, deadline: Deadline) -> FaultReport:
    """SIGKILL the engine core of `holder` alone: the worker process that registered with the
    frontend is left running. Dynamo 1.6.1's worker then ends itself once it sees its engine
    dead (its engine monitor, or the request that raised); one that outlives ENGINE_EXIT_S
    stays listed with no engine to serve (Dynamo issues 2698, 14657), and fails the case."""
    engine = engine_core(holder)
    done_before = inflight.finished
    try:
        engine.kill()
    except psutil.NoSuchProcess:
        raise CaseFailure(
            f"{holder.name}'s engine core (pid {engine.pid}) was gone before its SIGKILL"
        ) from None
    killed_at = time.monotonic()
    poll_until(
        lambda: (None, f"pid {engine.pid} alive") if holder.process.alive(engine) else (True, None),
        deadline.within(HOLDER_TIMEOUT_S),
        f"{holder.name}'s engine core to end on SIGKILL",
    )
    if left := holder.process.wait_gone(deadline.within(ENGINE_EXIT_S)):
        raise CaseFailure(
            f"{holder.name} was still running {ENGINE_EXIT_S:g} s after its engine core (pid "
            f"{engine.pid}) was killed: a worker with no engine stays listed: {left}"
        )
    if (code := holder.process.exit_code()) is not None and code < 0:
        raise CaseFailure(
            f"{holder.name} ended by signal {-code} after its engine core was killed, not by "
            f"itself: a crash, not the worker's own shutdown"
        )
    return FaultReport(
        "engine_failure", holder.name, engine.pid, ("SIGKILL",), done_before,
        engine_killed_at=killed_at,
    )  # fmt: skip


def engine_core(holder: Worker) -> psutil.Process:
    """The one process of the holder's tree titled as its engine's core."""
    if holder.engine_core is None:
        raise HandoffError(f"{holder.name} runs no engine core apart from its own process")
    found = []
    for proc in holder.process.tree():
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.cmdline()).startswith(holder.engine_core):
                found.append(proc)
    if len(found) != 1:
        raise CaseFailure(
            f"{holder.name}'s tree holds {len(found)} processes titled {holder.engine_core!r}, "
            f"not one"
        )
    return found[0]


def faulted_process(fault: str, holder: Worker, broker: ManagedProcess | None) -> ManagedProcess:
    """What `fault` signals: the deployment's nats-server for the broker's faults, else the
    holder's process."""
    return broker if fault in BROKER and broker else holder.process


def fault_broker(
    fault: str, broker: ManagedProcess, inflight: Watched, deadline: Deadline
) -> FaultReport:
    done_before = inflight.finished
    if fault == "broker_stall":
        broker.freeze(deadline)
    else:
        broker.kill()
        if left := broker.wait_gone(deadline):
            raise CaseFailure(f"{broker.name} still alive after SIGKILL: {left}")
    signals = (FIRST_SIGNAL[fault],)
    return FaultReport(fault, broker.name, broker.pid, signals, done_before)


def heal(holder: Worker, fault: FaultReport) -> None:
    """A stall: SIGCONT the stopped tree, which then runs on where it stopped. partition:
    remove the rules; TCP then retransmits what they dropped."""
    if fault.cut is not None:
        fault.cut.heal()
    else:
        holder.process.signal_tree(signal.SIGCONT)


def partition_flows(holder: Worker) -> list[firewall.Flow]:
    """Both directions of every TCP connection of the holder's tree but those to its status
    port (handoff's own reading of it) and to etcd (the discovery plane, whose cut is
    `etcd_partition`'s: on either discovery a partition cuts the same): its listening ports
    whole (the request plane's server, its event publisher), and the exact 4-tuple of each
    connection it opened (its response streams to the frontend, its NATS client). All of them
    are on loopback."""
    keep = {holder.ports["system"], *etcd_ports(holder.process.env)}
    sockets = tree_connections(holder.process)
    strangers = [c for c in sockets if c.raddr and not _on_loopback(c.raddr.ip)]
    if strangers:
        raise HandoffError(f"{holder.name} has connections off loopback: {strangers}")
    listening = {c.laddr.port for c in sockets if c.status == psutil.CONN_LISTEN} - keep
    flows = [firewall.Flow(sport=port) for port in sorted(listening)]
    flows += [firewall.Flow(dport=port) for port in sorted(listening)]
    for c in sockets:
        opened = c.status == psutil.CONN_ESTABLISHED and c.raddr
        if opened and c.laddr.port not in listening | keep and c.raddr.port not in keep:
            mine, theirs = (c.laddr.ip, c.laddr.port), (c.raddr.ip, c.raddr.port)
            flows += [firewall.Flow(*mine, *theirs), firewall.Flow(*theirs, *mine)]
    return flows


def tree_connections(process: ManagedProcess) -> list:
    """Every TCP connection of the process's tree, as psutil reads them."""
    sockets = []
    for proc in process.tree():
        try:
            sockets += proc.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue  # a helper that exited: its sockets went with it
    return sockets


def etcd_ports(env: dict[str, str]) -> set[int]:
    """The client ports of the etcd members a process was told of (`ETCD_ENDPOINTS`)."""
    endpoints = env.get("ETCD_ENDPOINTS", "")
    return {int(url.rsplit(":", 1)[1]) for url in endpoints.split(",") if url}


def _on_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


def prove_cut(cut: firewall.Cut, holder: Worker, deadline: Deadline) -> None:
    """The partition took effect once its rules have dropped a packet of the holder's."""

    def probe() -> tuple[int | None, str]:
        try:
            dropped = cut.dropped()
        except HandoffError as exc:
            return None, str(exc)
        return (dropped or None), f"{dropped} packets dropped by {len(cut.flows)} rules"

    poll_until(probe, deadline, f"the partition of {holder.name} to drop a packet")


def discovery(case: Case, chosen: str) -> Layout:
    """Where `case`'s workers register: the `chosen` discovery (the file store, or etcd of one
    member), but always etcd for the discovery plane's cases: three members to lose one of,
    and three pinned to a process each to cut one worker off."""
    if case.topology != DISCOVERY_PLANE.name:
        return FILE if chosen == "file" else Layout("etcd", 1)
    if case.fault == "etcd_member_loss":
        return Layout("etcd", 3)
    if case.fault == "etcd_partition":
        return Layout("etcd", 3, pinned=True)
    return Layout("etcd", 1)


def missing_for(case: Case, chosen: str) -> tuple[str, str] | None:
    """What of `case` cannot run on this machine and why, in one line that says the fix; None
    when it can: a partition (from the frontend or from etcd) needs nftables, a case on etcd
    needs etcd."""
    if case.fault in ("partition", "etcd_partition") and (why := firewall.missing()):
        return case.fault, why
    if discovery(case, chosen).kind == "etcd" and (why := etcd.missing()):
        return "etcd", why
    return None


def worker_env(fault: str) -> dict[str, str]:
    """The environment `fault`'s workers get beyond the backend's launch."""
    return dict(WORKER_ENV[fault][1]) if fault in WORKER_ENV else {}


def worker_tag(fault: str) -> tuple[str, ...]:
    """What `fault` adds to its pool's key: workers launched differently share no pool."""
    return (WORKER_ENV[fault][0],) if fault in WORKER_ENV else ()
