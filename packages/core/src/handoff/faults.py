"""Finding the worker that holds the request, proving it is in its window, and faulting it.

A fault lands while its request is in flight, by construction; where it could not, the case
says it missed its window, which is the harness's miss, never the system's failure.

Three rules make the window certain on a machine of any speed:
- **Room before the fault** (`require_room`): a fault that lets the holder run on for a while
  (a drain's graceful bound, its drain timeout) is sent only while the request has that long
  left, plus twice the harness's lag measured on the case (its last reading of the holder), as
  a machine twice as slow would need. Else it is not sent.
- **Held at the fault** (`inject`): a fault that ends, stops or cuts the holder, or the
  broker under it, is made while every thread of the holder is stopped, so nothing it holds
  can end between the proof and the fault, however late the harness is.
- **Proven at the confirmation** (`Watch.outside`): at that moment the request is still open
  (and, in a prefill window, has no token out).

A response that ended complete, or left its prefill worker, before its fault is a
`MissedWindow`: not proven, counted apart, with the timeline. One that the system ended
otherwise (an error, a short answer) before any fault is the system's failure, named so.
"""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import psutil

from handoff import continuity
from handoff.backend import Backend, Worker
from handoff.client import InFlight, completion_problems
from handoff.errors import CaseFailure, ConnectionCut, HandoffError, MissedWindow
from handoff.machine import firewall, worker_logs
from handoff.machine.polling import Deadline, poll_until
from handoff.machine.processes import ManagedProcess, await_stopped
from handoff.metrics import Unanswered, once_answered

HOLDER_TIMEOUT_S = 30.0
#: How long a partition's rules may take to drop their first packet: the holder streams its
#: tokens on, so only rules that missed its connections drop nothing.
CUT_PROOF_S = 10.0
#: The least time over which a response's rate is measured before its rest is judged by it.
RATE_WINDOW_S = 0.5
#: drain_expired: the drained worker's own drain timeout, shorter than the rest of any such
#: case's request; after it, the worker must exit on its own within DRAIN_EXIT_S.
DRAIN_TIMEOUT_S = 1
DRAIN_EXIT_S = 15.0
#: How long past its own drain timeout a worker may still deliver a request's last tokens (its
#: runtime's teardown, the client's read) before a response it let end complete is one it
#: served on past that timeout (`FaultReport.blames`).
SERVED_PAST_S = 1.0
#: engine_failure: how long the worker may take to notice its engine's death by its engine
#: monitor alone (one 2 s interval and one check's timeout, WORKER_ENV), where no request of
#: its raised it first; and the longest it may take to exit by itself: that, the engine's
#: shutdown (WORKER_ENV) and the process's own exit.
ENGINE_NOTICE_S = 2.0 + 10.0
ENGINE_EXIT_S = ENGINE_NOTICE_S + 10.0 + 15.0


#: The harness's lag measured on this run, as a machine twice as slow would have it.
LAG_SLOWER_BY = 2.0
#: What no reading measures: a signal's delivery, the scheduler's tick.
FLOOR_S = 0.25


def ended_before(inflight: InFlight, when: str) -> Exception:
    """A response over before its fault (`when` says which moment): a missed window where it
    completed as its request asks, the system's failure otherwise."""
    response = inflight.response
    if completed(inflight):
        ago = time.monotonic() - (response.finished_at or time.monotonic())
        return MissedWindow(
            f"the response had ended complete {when}, {ago:.2f} s earlier: {response.summary()}"
        )
    said = f"the system ended the response {when}, before any fault reached it: "
    if response.exception and not response.closed_by_client:
        return ConnectionCut(said + response.summary())
    return CaseFailure(said + response.summary())


def ended_unheld(workers: list[Worker], inflight: InFlight) -> Exception:
    """A response over before any of `workers` reported it: a missed window only where one of
    them received it (its log names the request: it held it, and ended it before any reading
    showed it); else none of the role the fault aims at served it, the system's failure."""
    when = "before any worker reported it in flight"
    ids = {inflight.request.request_id} if inflight.request.request_id else set()
    ids |= {
        continuity.request_id(str(c.data["id"])) for c in inflight.response.chunks if "id" in c.data
    }
    missed = ended_before(inflight, when)
    if isinstance(missed, MissedWindow) and not worker_logs.received(workers, ids):
        names = ", ".join(w.name for w in workers)
        return CaseFailure(
            f"the response ended complete {when}, and no log of {names} names it: none of the "
            f"workers the fault aims at served it: {inflight.response.summary()}"
        )
    return missed


def completed(inflight: InFlight) -> bool:
    """Whether the response ended whole, as its request asks (`verdict.completion_problems`)."""
    tokens, finish = inflight.request.ends
    return not completion_problems(inflight.response, tokens, finish)


@dataclass(frozen=True)
class Watch:
    """One request a fault must land on while it is in its window: open, and, in a prefill
    window (`tokens_out` given), with no token out yet; with `all_out` given (the tokens out,
    and how many the request asks), not every token out yet: a worker that has generated the
    whole response holds nothing, whatever the frontend still has to deliver."""

    inflight: InFlight
    tokens_out: Callable[[], int] | None = None
    all_out: tuple[Callable[[], int], int] | None = None

    @property
    def finished(self) -> bool:
        return self.inflight.finished

    def outside(self, when: str) -> Exception | None:
        """Why the request is no longer in its window `when`, or None while it is."""
        if self.inflight.finished:
            return ended_before(self.inflight, when)
        if self.tokens_out is not None and (out := self.tokens_out()):
            return MissedWindow(
                f"{out} token(s) were out {when}: the prefill had ended, and the request with "
                f"it: {self.inflight.response.summary()}"
            )
        if self.all_out is not None and (out := self.all_out[0]()) >= self.all_out[1]:
            return MissedWindow(
                f"all {out} tokens were out {when}: the worker had generated the whole "
                f"response, which the frontend was still delivering"
            )
        return None


def require_room(remaining_s: float | None, wait_s: float, lag_s: float, fault: str) -> str:
    """Before a fault that lets the holder run for `wait_s`: the request must have that long
    left and twice the harness's lag `lag_s` (and `FLOOR_S`), or the fault is not sent (a
    missed window). `remaining_s` None: unknown, and nothing to hold the fault to. Says what
    was found."""
    need_s = wait_s + LAG_SLOWER_BY * lag_s + FLOOR_S
    if remaining_s is None:
        return f"{fault}: the request's time left is unknown"
    if remaining_s < need_s:
        raise MissedWindow(
            f"{remaining_s:.2f} s of the request were left before {fault}, which needs "
            f"{need_s:.2f} s ({wait_s:g} s its own wait, twice the {lag_s:.2f} s lag measured, "
            f"{FLOOR_S:g} s): the fault was not sent"
        )
    return f"{remaining_s:.2f} s left, {need_s:.2f} s needed"


class Watched(Protocol):
    """What a fault must land before the end of: one response (`Watch`), or a load
    case's requests on the worker it faults."""

    @property
    def finished(self) -> bool: ...

    def outside(self, when: str) -> Exception | None: ...


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
    #: A drain whose request still had the drain's wait left when its first signal went out
    #: (`require_room`): a response it let end complete with no move is the worker's doing,
    #: not a fault that came too late.
    room_proven: bool = False
    #: When the first signal went out (monotonic).
    signalled_at: float = 0.0
    #: A drain's wait after its SIGTERM (`Lifecycle.runs_on`), and the harness's lag measured on the
    #: way to it (`Proof.lag_s`).
    bound_s: float | None = None
    lag_s: float = 0.0
    #: The worker's own drain timeout, not the harness's SIGKILL, ends what it holds at the
    #: bound (drain_expired).
    ends_itself: bool = False

    def blames(self, ended_at: float) -> bool:
        """Whether a response the drain's holder let end complete at `ended_at` (monotonic),
        with no move counted, is the system's doing rather than the harness's lateness:
        where the worker's own timeout ends it (`ends_itself`), with the request's room proven
        at the SIGTERM, or ended well past that timeout (`SERVED_PAST_S`, and twice the lag);
        else (graceful_shutdown), where the harness's SIGKILL ends it, with its room proven
        and ended before the bound had even passed (a late SIGKILL is the harness's)."""
        if self.bound_s is None:
            return False
        bound_at = self.signalled_at + self.bound_s
        if self.ends_itself:
            slack = SERVED_PAST_S + LAG_SLOWER_BY * self.lag_s
            return self.room_proven or ended_at > bound_at + slack
        return self.room_proven and ended_at < bound_at


def find_holder(
    backend: Backend, workers: list[Worker], inflight: InFlight, deadline: Deadline
) -> Worker:
    """The one worker that reports the request in flight, by its own state; never a guess: while
    any worker does not answer, another may hold it too, so the search goes on."""

    def probe() -> tuple[Worker | None, str]:
        if inflight.finished:
            raise ended_unheld(workers, inflight)
        try:
            holders = backend.holders(workers)
        except Unanswered as exc:
            return None, str(exc)
        if len(holders) > 1:
            names = ", ".join(w.name for w in holders)
            raise CaseFailure(f"more than one worker reports a request in flight: {names}")
        return (holders[0] if holders else None), "no worker reports a request in flight"

    return poll_until(probe, deadline.within(HOLDER_TIMEOUT_S), "a worker to hold the request")


@dataclass(frozen=True)
class Proof:
    """How the request was proven in its window, and the harness's lag measured on the way:
    the seconds its last reading of the holder took (`require_room`)."""

    how: str
    lag_s: float


def prove_in_flight(
    backend: Backend,
    holder: Worker,
    inflight: InFlight,
    tokens_seen: Callable[[], int],
    window: str,
    tokens_needed: int,
    what: str,
    deadline: Deadline,
) -> Proof:
    """The request provably in its fault window on `holder`, or the case ends: a missed
    window where the response ended complete or left its prefill first, the system's failure
    where it ended otherwise.

    "decoding": wait until `tokens_needed` tokens are out while the response is open.
    "prefill": no token may be out yet. Either way `holder` must still report the request
    (asked until it answers).
    """

    def probe() -> tuple[int | None, str]:
        if inflight.finished:
            raise ended_before(inflight, f"before {tokens_needed} {what}")
        seen = tokens_seen()
        return (seen if seen >= tokens_needed else None), f"{seen} {what}"

    if window == "prefill":
        if seen := tokens_seen():
            raise MissedWindow(
                f"{seen} {what} before the fault, which must land during prefill, before the "
                f"first token"
            )
    else:
        seen = poll_until(probe, deadline, f"{tokens_needed} {what}")
    asked = time.monotonic()
    still_held = once_answered(
        lambda: holder in backend.holders([holder]),
        deadline.within(HOLDER_TIMEOUT_S),
        f"{holder.name} to say whether it still holds the request",
    )
    lag_s = time.monotonic() - asked
    if inflight.finished:
        raise ended_before(inflight, f"while {holder.name} was asked for it")
    if not still_held:
        gone = f"{holder.name} no longer reports the request, open: {inflight.response.summary()}"
        if window != "prefill":
            raise CaseFailure(gone)
        # Its prefill ended, if the first token follows; else the request was lost there.
        poll_until(
            lambda: (True if tokens_seen() or inflight.finished else None, "no token out"),
            deadline,
            f"a first token, once {holder.name} no longer reported the request",
        )
        if not tokens_seen():  # it ended with no token: lost at the handover, not late
            raise ended_before(inflight, f"once {holder.name} no longer reported it")
        raise MissedWindow(f"{gone}; its prefill had ended: a token followed")
    return Proof(f"{seen} {what}, response open, {holder.name} reports it in flight", lag_s)


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
            raise ended_before(inflight, f"before its last {seconds:g} s")
        seen, elapsed = tokens_seen(), time.monotonic() - since
        rate = (seen - first) / elapsed if elapsed >= RATE_WINDOW_S else 0.0
        rest = max_tokens - seen
        state = f"{seen} {what}, {rest} to come at {rate:.0f} tokens/s"
        return (state if rate and rest <= rate * seconds else None), state

    return poll_until(probe, deadline, f"the last {seconds:g} s of the response")


def kill(fault: str, holder: Worker, watched: Watched, deadline: Deadline) -> FaultReport:
    """SIGKILL the holder's tree, held first (`hold`), and wait until it is gone."""
    hold(holder, watched, "SIGKILL", deadline)
    holder.process.kill()
    if left := holder.process.wait_gone(deadline.within(HOLDER_TIMEOUT_S)):
        raise CaseFailure(f"{holder.name} still alive after SIGKILL: {left}")
    return FaultReport(fault, holder.name, holder.process.pid, ("SIGKILL",), False)


def stall(fault: str, holder: Worker, watched: Watched, deadline: Deadline) -> FaultReport:
    """SIGSTOP the holder's tree (`hold`); it stays so until `heal`."""
    hold(holder, watched, "SIGSTOP", deadline)
    return FaultReport(fault, holder.name, holder.process.pid, ("SIGSTOP",), False)


def partition(fault: str, holder: Worker, watched: Watched, deadline: Deadline) -> FaultReport:
    """Drop every packet of the held holder's connections (`partition_flows`) and prove the
    rules dropped some; they stay until `heal`, and are removed at teardown whatever happens."""
    process = holder.process
    hold(holder, watched, "nftables drop", deadline)
    try:
        cut = firewall.Cut(partition_flows(holder))
    finally:
        process.signal_tree(signal.SIGCONT)
    prove_cut(cut, holder, deadline.within(CUT_PROOF_S))
    signals = ("nftables drop",)
    return FaultReport(fault, holder.name, process.pid, signals, False, cut=cut)


def fault_broker(
    fault: str,
    stops: bool,
    holder: Worker,
    watched: Watched,
    broker: ManagedProcess | None,
    deadline: Deadline,
) -> FaultReport:
    """SIGSTOP the deployment's nats-server (`stops`), or SIGKILL it and wait until it is
    gone, with the holder held meanwhile: the request is in flight when it takes effect."""
    if broker is None:
        raise HandoffError(f"{fault} needs the deployment's nats-server, and it runs none")
    first = "SIGSTOP" if stops else "SIGKILL"
    hold(holder, watched, first, deadline)
    try:
        if stops:
            broker.freeze(deadline.within(HOLDER_TIMEOUT_S))
        else:
            broker.kill()
            if left := broker.wait_gone(deadline.within(HOLDER_TIMEOUT_S)):
                raise CaseFailure(f"{broker.name} still alive after SIGKILL: {left}")
    finally:
        holder.process.signal_tree(signal.SIGCONT)
    return FaultReport(fault, broker.name, broker.pid, (first,), False)


def hold(holder: Worker, watched: Watched, what: str, deadline: Deadline) -> None:
    """Stop every thread of the holder's tree, then prove its request still in its window
    (`Watch.outside`); one that left it is a missed window (or the system's failure),
    and the holder runs again."""
    try:
        holder.process.freeze(deadline.within(HOLDER_TIMEOUT_S))
        missed = watched.outside(f"when {holder.name} was held for {what}")
    except BaseException:  # a reading that failed, an interrupt: never leave it stopped
        holder.process.signal_tree(signal.SIGCONT)
        raise
    if missed:
        holder.process.signal_tree(signal.SIGCONT)
        raise missed


def drain(
    fault: str,
    holder: Worker,
    watched: Watched,
    bound_s: float,
    ends_itself: bool,
    deadline: Deadline,
) -> FaultReport:
    """SIGTERM the parent; then, where the worker's own drain timeout `bound_s` ends what it
    holds (`ends_itself`), wait for the tree to exit by itself; else, unless the whole tree
    had exited by the graceful bound `bound_s` (its parent's exit status read, then its tree),
    hold it and SIGKILL what is left. The worker drains on: whether the response had ended by
    the last signal is read at that moment (`FaultReport`)."""
    process = holder.process
    signalled_at = time.monotonic()
    if not process.signal_leader(signal.SIGTERM):
        raise CaseFailure(
            f"{holder.name} (pid {process.pid}) had ended before its SIGTERM, by itself: "
            f"exit code {process.exit_code()}"
        )
    # The bound counts from the SIGTERM, never from after the listing below, which takes
    # seconds on a busy machine: a SIGKILL that late would find the request ended.
    bound = deadline.within(bound_s)
    process.tree()  # remember the descendants before the parent, draining, can orphan them
    drained = FaultReport(fault, holder.name, process.pid, ("SIGTERM",), False)
    drained = replace(drained, signalled_at=signalled_at, bound_s=bound_s, ends_itself=ends_itself)
    if ends_itself:
        if left := process.wait_gone(deadline.within(bound_s + DRAIN_EXIT_S)):
            raise CaseFailure(
                f"{holder.name} was still running {bound_s + DRAIN_EXIT_S:g} s after "
                f"SIGTERM, its drain timeout {bound_s:g} s: {left}"
            )
        return replace(drained, response_done_at_kill=watched.finished)
    if process.exited_within(bound) and not process.tree():
        return replace(drained, finished_in_grace=watched.finished)
    process.freeze(deadline.within(HOLDER_TIMEOUT_S))
    done_before = watched.finished
    process.kill()
    if left := process.wait_gone(deadline.within(HOLDER_TIMEOUT_S)):
        raise CaseFailure(f"{holder.name} still alive after SIGTERM+SIGKILL: {left}")
    signals = ("SIGTERM", "SIGKILL")
    return replace(drained, signals=signals, response_done_at_kill=done_before)


def kill_engine(fault: str, holder: Worker, watched: Watched, deadline: Deadline) -> FaultReport:
    """SIGKILL the engine core of `holder` alone, stopped first and its request proven in its
    window: the worker process that registered with the frontend is left running. Dynamo
    1.6.1's worker then ends itself once it sees its engine dead (its engine monitor, or the
    request that raised); one that outlives ENGINE_EXIT_S stays listed with no engine to serve
    (Dynamo issues 2698, 14657), and fails the case."""
    engine = engine_core(holder)
    try:
        engine.send_signal(signal.SIGSTOP)
        await_stopped(lambda: [engine], deadline.within(HOLDER_TIMEOUT_S), engine.name())
        if missed := watched.outside(f"when {holder.name}'s engine core was stopped"):
            engine.send_signal(signal.SIGCONT)
            raise missed
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
        fault, holder.name, engine.pid, ("SIGKILL",), False, engine_killed_at=killed_at
    )


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
