"""The discovery plane's faults on etcd (`cases.DISCOVERY`), made on a pool's own etcd while a
request is in flight on the holder, and what each must leave once the response has ended.

A request in flight does not go through etcd: whatever befalls etcd or a lease, the response
completes where it is (`policies.expected_outcome`), except after a SIGKILL (lease_expiry),
where it moves as after worker_failure. What each fault must leave, with bounds from the lease
handoff gives Dynamo (`etcd.LEASE_TTL_S`):

- lease_expiry: the frontend no longer lists the dead worker within its lease, and nothing
  removed its entries but the lease running out.
- lease_revoked: the frontend drops the worker at once; the worker, its lease gone, ends by
  itself (Dynamo routes a lost lease through its graceful shutdown).
- etcd_partition: the frontend drops the cut-off worker within its lease; healed, the worker
  must serve again (Dynamo issue 3493: a lost lease never recovers).
- etcd_member_loss: with one member of three gone, new requests complete for a lease and
  more; the member is started again for the pool's next case.
- etcd_restart: etcd back within the leases, every process goes on: new requests complete for
  a lease and more after it came back (3493 again: the frontend shuts itself down).
- etcd_loss: with etcd gone for good, every process ends by itself within its lease and its
  shutdown: none keeps serving from a discovery it can no longer read; the pool is discarded.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import psutil

from handoff import client, faults
from handoff.backend import Worker
from handoff.client import Request, Response
from handoff.deployment import Deployment
from handoff.errors import CaseFailure, MissedAfterFault
from handoff.history import History
from handoff.machine import etcd, firewall
from handoff.machine.polling import Deadline, Timeout, poll_until
from handoff.machine.processes import ManagedProcess
from handoff.pool import Pool, stop_trees
from handoff.responses import recovery
from handoff.responses.waits import CaseRun
from handoff.verdict import completion_problems

#: How long after its lease ran out a worker may still be listed: etcd expires leases every
#: 0.5 s and the frontend hears of it through its watch (measured: 1 s, docs/known-issues.md).
LISTING_SLACK_S = 5.0
#: How long a process whose lease was lost may take to end by itself, nothing in flight: its
#: graceful shutdown and its exit (faults.DRAIN_EXIT_S).
EXIT_S = faults.DRAIN_EXIT_S
#: etcd_restart: how much sooner than the first lease to run out etcd is started again, at least
#: (its start and election take about 1 s; under the busy loop a restart was back about 2.1 s
#: after it began: 8.1 s after the kill, past an 8 s lease, at a margin of 2 s); or twice as long
#: as its members took to start on the
#: run (`Cluster.slowest_start_s`), if longer. etcd stays down as long as every lease allows (read
#: from etcd just before the kill), so that every process's renewal falls due while it is down, and
#: none runs out: the longer the outage, the likelier the frontend's race (at 0.5-1 s of a 10 s
#: lease it showed in 4 of 8 outages, at 3 s in 6 of 9, at 4.5 s in 5 of 6: docs/known-issues.md).
#: Back past that lease, the case fails: it would be no restart within the leases.
OUTAGE_MARGIN_S = 3.0
#: How often a probe goes out while the deployment must keep serving.
PROBE_EVERY_S = 1.0


def aim_most_connected(deployment: Deployment) -> list[etcd.Member]:
    """The member Dynamo's processes hold most connections to (`most_connected`), chosen
    before the request is sent: reading every process's connections took 5 s on a loaded
    machine, in which the request ended."""
    assert deployment.pool.etcd is not None
    return [most_connected(deployment.pool.etcd, deployment)]


def aim_every_member(deployment: Deployment) -> list[etcd.Member]:
    assert deployment.pool.etcd is not None
    return list(deployment.pool.etcd.members)


#: What an act on etcd does with the holder held: its report, and what follows once the
#: holder runs again (etcd started again), if anything.
Act = Callable[[CaseRun, Worker, list[etcd.Member]], "tuple[faults.FaultReport, Then | None]"]
Then = Callable[[faults.FaultReport], faults.FaultReport]


def on_etcd(act: Act) -> Callable[..., faults.FaultReport]:
    """A fault of the discovery plane as an injection (`Lifecycle.inject`): `act`, on the
    pool's etcd or on the holder's lease, made with the holder held (`faults.hold`); a cut
    proven to drop a packet once the holder runs again (its keep-alives meet the rules)."""

    def inject(
        run: CaseRun, holder: Worker, watched: faults.Watched, aimed: list[etcd.Member]
    ) -> faults.FaultReport:
        pool, deadline = run.deployment.pool, run.deadline
        if pool.etcd is None:
            raise CaseFailure(f"{run.case.fault} needs a pool on etcd, and {pool.name} is not")
        faults.hold(holder, watched, run.lifecycle.first_signal, deadline)
        try:
            report, then = act(run, holder, aimed)
        finally:
            holder.process.signal_tree(signal.SIGCONT)
        if report.cut is not None:
            faults.prove_cut(report.cut, holder, deadline.within(faults.CUT_PROOF_S))
        report = then(report) if then else report
        run.history.record("discovery_faulted", on=report.worker, signals=list(report.signals))
        return report

    return inject


def revoke(run: CaseRun, holder: Worker, _: list[etcd.Member]) -> tuple[faults.FaultReport, None]:
    """Revoke the holder's leases."""
    pool = run.deployment.pool
    assert pool.etcd is not None
    if not (ids := pool.instance_ids.get(holder.name)):
        raise CaseFailure(f"no instance id of {holder.name} is known: no lease to revoke")
    if ended := [i for i in sorted(ids) if not pool.etcd.revoke(i)]:
        raise CaseFailure(f"{holder.name}'s lease(s) {ended} had ended before the revoke")
    report = faults.FaultReport(run.case.fault, holder.name, holder.process.pid, ("revoke",), False)
    return report, None


def cut_from_etcd(
    run: CaseRun, holder: Worker, _: list[etcd.Member]
) -> tuple[faults.FaultReport, None]:
    """Drop every packet to and from the holder's own member (`Layout.pinned`)."""
    port = run.deployment.pool.pinned[holder.name].client_port
    cut = firewall.Cut([firewall.Flow(dport=port), firewall.Flow(sport=port)])
    signals = ("nftables drop",)
    report = faults.FaultReport(run.case.fault, holder.name, holder.process.pid, signals, False)
    return replace(report, cut=cut), None


def kill_members(
    run: CaseRun, _: Worker, members: list[etcd.Member]
) -> tuple[faults.FaultReport, None]:
    """SIGKILL `members` and wait until they are gone."""
    killed = [m.process for m in members if m.process is not None]
    _kill(killed, run.deadline)
    report = faults.FaultReport(run.case.fault, members[0].name, killed[0].pid, ("SIGKILL",), False)
    return report, None


def restart_members(
    run: CaseRun, holder: Worker, members: list[etcd.Member]
) -> tuple[faults.FaultReport, Then]:
    """SIGKILL `members`, then, once the holder runs again, start them again within every
    lease held at the kill (`restarted`), read just before it."""
    cluster = run.deployment.pool.etcd
    assert cluster is not None
    lease_s = cluster.shortest_lease()
    killed_at = time.monotonic()
    report, _ = kill_members(run, holder, members)
    return report, lambda r: restarted(cluster, members, r, lease_s, killed_at, run.deadline)


def restarted(
    cluster: etcd.Cluster | None,
    members: list[etcd.Member],
    report: faults.FaultReport,
    lease_s: int,
    killed_at: float,
    deadline: Deadline,
) -> faults.FaultReport:
    """etcd_restart once its members were killed (at `killed_at`): start them again on their
    data as late as every lease held at the kill allows (`lease_s`, less `OUTAGE_MARGIN_S`);
    back past it, the case's premise went unmet: a missed window."""
    assert cluster is not None
    margin_s = max(OUTAGE_MARGIN_S, faults.LAG_SLOWER_BY * cluster.slowest_start_s)
    down_s = lease_s - margin_s - (time.monotonic() - killed_at)
    _down_for(max(down_s, 0.0), deadline)
    cluster.restart(members, deadline)
    back_s = time.monotonic() - killed_at
    if back_s >= lease_s:  # the case's premise, not the system's promise, went unmet
        raise MissedAfterFault(
            f"etcd was back {back_s:.1f} s after its kill, past the shortest lease it held "
            f"({lease_s} s): no restart within the leases"
        )
    signals = ("SIGKILL", f"started again, healthy {back_s:.1f} s after")
    return replace(report, worker="etcd", signals=signals)


def most_connected(cluster: etcd.Cluster, deployment: Deployment) -> etcd.Member:
    """The member most of the deployment's Dynamo processes hold connections to: the one
    whose loss they must ride out (losing another, they might not notice). One none holds
    would prove nothing: a failure."""
    ports = Counter(
        c.raddr.port
        for process in deployment.dynamo_processes
        for c in faults.tree_connections(process)
        if c.raddr and c.status == psutil.CONN_ESTABLISHED
    )
    counts = {m.name: ports[m.client_port] for m in cluster.members}
    member = max(cluster.members, key=lambda m: counts[m.name])
    if not counts[member.name]:
        raise CaseFailure(f"no Dynamo process holds a connection to any etcd member: {counts}")
    return member


def _down_for(seconds: float, deadline: Deadline) -> None:
    """The outage itself: etcd stays down `seconds`, the fault's length, not a wait for a
    condition."""
    outage = deadline.within(seconds)
    poll_until(lambda: (True if outage.expired() else None, "down"), deadline, "the outage")


def _kill(processes: list[ManagedProcess], deadline: Deadline) -> None:
    """SIGKILL etcd's members and wait until they are gone (`pool.stop_trees`)."""
    if survivors := stop_trees(processes, [], deadline.within(faults.HOLDER_TIMEOUT_S)):
        raise CaseFailure("; ".join(survivors))


def lease_expired_after(struck: recovery.Struck) -> list[str]:
    """lease_expiry: the frontend no longer lists the dead worker within its lease."""
    lease_s = etcd.LEASE_TTL_S + LISTING_SLACK_S
    return unlisted(struck, lease_s)


def revoked_after(struck: recovery.Struck) -> list[str]:
    """lease_revoked: the frontend drops the worker at once; the worker ends by itself."""
    holder, history = struck.holder, struck.run.history
    problems = unlisted(struck, LISTING_SLACK_S)
    why = "its lease was revoked"
    return problems + exit_problems([holder.process], why, struck.faulted_at, EXIT_S, history)


def cut_from_etcd_after(struck: recovery.Struck) -> list[str]:
    """etcd_partition: the frontend drops the cut-off worker within its lease; healed, the
    worker must serve again; then it is retired (never drawn again: its pool replaces it)."""
    run, holder = struck.run, struck.holder
    problems = unlisted(struck, etcd.LEASE_TTL_S + LISTING_SLACK_S)
    assert struck.report.cut is not None
    struck.report.cut.heal()
    run.history.record("worker_resumed", worker=holder.name, how="the cut removed")
    problems += recovery.rejoin_problems(
        run.deployment, holder, struck.request, run.history, struck.shape
    )
    recovery.retire(holder, run.deadline)
    return problems


def member_lost_after(struck: recovery.Struck) -> list[str]:
    """etcd_member_loss: new requests complete; the member is started again for the pool's
    next case."""
    run = struck.run
    problems = kept_serving(
        run.deployment, struck.request, "after one etcd member was lost", run.history
    )
    restart_lost(run.deployment.pool, run.deadline, run.history)
    return problems


def restarted_after(struck: recovery.Struck) -> list[str]:
    """etcd_restart: every process goes on, the frontend's own lease read meanwhile
    (`FrontendLease`); then every gauge at 0, but a frontend that stopped serving is not asked
    for its gauges (`Lifecycle.idle_after` is off)."""
    run = struck.run
    watch = FrontendLease(run.deployment, run.history)
    when = "after etcd came back"
    problems = kept_serving(run.deployment, struck.request, when, run.history, watch)
    return problems or struck.idle()


def lost_after(struck: recovery.Struck) -> list[str]:
    """etcd_loss: every process ends by itself within its lease and its shutdown, the
    frontend too: no gauge is read (`Lifecycle.idle_after` is off)."""
    deployment, history = struck.run.deployment, struck.run.history
    bound_s = deployment.pool.layout.lease_s + EXIT_S
    ended = deployment.dynamo_processes
    return exit_problems(ended, "etcd was lost", struck.faulted_at, bound_s, history)


def unlisted(struck: recovery.Struck, within_s: float) -> list[str]:
    run = struck.run
    return unlisted_problems(
        run.deployment, struck.holder, struck.faulted_at, within_s, run.history
    )


def unlisted_problems(
    deployment: Deployment, worker: Worker, since: float, within_s: float, history: History
) -> list[str]:
    """The frontend must drop `worker` within `within_s` of `since`; an unknown instance id
    is no proof (recovery.dropped_at)."""
    if not deployment.pool.instance_ids.get(worker.name):
        return [f"no instance id of {worker.name} is known: its leaving discovery is unproven"]
    try:
        recovery.dropped_at(deployment, worker, since, Deadline(within_s), history, within_s)
    except Timeout as exc:
        return [f"the frontend still listed {worker.name} {within_s:g} s after the fault ({exc})"]
    return []


def exit_problems(
    processes: list[ManagedProcess], why: str, since: float, within_s: float, history: History
) -> list[str]:
    """Each of `processes` must end by itself, with code 0 (its own shutdown), within
    `within_s` of `since` (the fault); a problem for each that did not."""
    deadline = Deadline(max(since + within_s - time.monotonic(), 0.0))

    def probe() -> tuple[bool | None, str]:
        running = [p.name for p in processes if p.exit_code() is None]
        return (None if running else True), f"still running: {', '.join(running)}"

    problems = []
    try:
        poll_until(probe, deadline, f"every process to end by itself after {why}")
    except Timeout:
        running = [p.name for p in processes if p.exit_code() is None]
        problems += [f"{name} still ran {within_s:g} s after {why}" for name in running]
    codes = {p.name: p.exit_code() for p in processes}
    history.record("ended_by_themselves", why=why, exit_codes=codes)
    return problems + [
        f"{name} ended with code {code} after {why}, not by its own shutdown"
        for name, code in codes.items()
        if code not in (None, 0)
    ]


def one_request_problems(
    deployment: Deployment, request: Request, when: str, history: History
) -> list[str]:
    """One new request, sent once, must complete in full (`verdict.completion_problems`)."""
    probe = recovery.short(request)
    response = Response()
    client.send(deployment.base_url, probe, response, read_timeout_s=recovery.PROBE_READ_S)
    history.record("new_request", sent=when, response=response.summary())
    found = completion_problems(response, recovery.REJOIN_TOKENS)
    return [f"a new request sent {when} failed: {problem}" for problem in found]


def restart_lost(pool: Pool, deadline: Deadline, history: History) -> None:
    """Start again every member that is gone, on its data, and wait for a leader."""
    assert pool.etcd is not None
    lost = [m for m in pool.etcd.members if not pool.etcd.alive(m)]
    pool.etcd.restart(lost, deadline)
    history.record("etcd_restarted", members=[m.name for m in lost])


class FrontendLease:
    """Reads the frontend's own leases from etcd, each time it is called: every lease etcd
    holds that is no worker's (Dynamo 1.6.1: a worker's instance id is its lease), its seconds
    left (None once it has ended), and whether the frontend still ran
    (`frontend_lease_read`, what `responses.witnesses.frontend_gave_up` reads). A reading that
    failed is recorded as such."""

    def __init__(self, deployment: Deployment, history: History) -> None:
        assert deployment.pool.etcd is not None
        self.cluster, self.deployment, self.history = deployment.pool.etcd, deployment, history
        self.known: set[int] = set()

    def __call__(self) -> None:
        workers = set().union(*self.deployment.pool.instance_ids.values())
        frontend = self.deployment.frontend
        running = frontend is not None and frontend.exit_code() is None
        try:
            self.known |= self.cluster.leases() - workers
            left = {f"{lease:x}": self.cluster.time_to_live(lease) for lease in sorted(self.known)}
        except etcd.Unanswered as exc:
            self.history.record("frontend_lease_read", failed=str(exc), frontend_running=running)
            return
        self.history.record("frontend_lease_read", left=left, frontend_running=running)


def kept_serving(
    deployment: Deployment,
    request: Request,
    after: str,
    history: History,
    watch: FrontendLease | None = None,
) -> list[str]:
    """From now (`after`: what befell etcd) for a lease and `LISTING_SLACK_S` more, a new
    request every `PROBE_EVERY_S` must complete. The first that fails ends the watch; the
    frontend is then given `EXIT_S` to end, and the processes of the case that ended are
    named. `watch`, where given, reads the frontend's lease before each request and once the
    frontend ended."""
    window_s = etcd.LEASE_TTL_S + LISTING_SLACK_S
    since = time.monotonic()
    sent: list[float] = []

    def probe() -> tuple[bool | None, str]:
        now = time.monotonic()
        if sent and now - since >= window_s:
            return True, ""
        if sent and now - sent[-1] < PROBE_EVERY_S:
            return None, f"{len(sent)} request(s) completed"
        sent.append(now)
        if watch is not None:
            watch()
        if found := one_request_problems(deployment, request, after, history):
            raise CaseFailure(f"{found[0]} ({now - since:.1f} s after)")
        return None, f"{len(sent)} request(s) completed"

    try:
        poll_until(probe, Deadline(window_s + recovery.PROBE_READ_S), "the deployment to serve")
    except CaseFailure as exc:
        ended = ended_after(deployment, after)
        if watch is not None:
            watch()
        return [str(exc), *ended]
    history.record("kept_serving", seconds=window_s, requests=len(sent))
    return []


def ended_after(deployment: Deployment, after: str) -> list[str]:
    """Once a probe failed: the frontend has `EXIT_S` to end (a frontend that shuts itself down
    does so within it); then each process of the case that ended, named with its code."""
    frontend = deployment.frontend
    if frontend is not None:
        with contextlib.suppress(Timeout):
            poll_until(
                lambda: (True if frontend.exit_code() is not None else None, "running"),
                Deadline(EXIT_S),
                "the frontend to end",
            )
    return [
        f"{p.name} had ended (code {p.exit_code()}) {after}"
        for p in deployment.dynamo_processes
        if p.exit_code() is not None
    ]
