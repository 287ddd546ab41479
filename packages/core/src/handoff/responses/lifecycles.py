"""handoff's own fault lifecycles (`handoff.lifecycle.Lifecycle`), registered through the
`handoff.lifecycles` entry point as a plugin's are. Each is composed of the primitives that
make a fault (`handoff.faults`), record what it left and judge its aftermath
(`responses.recovery`, `responses.discovery_plane`): these definitions are the only place a
fault's name decides what is done."""

from __future__ import annotations

from handoff import faults
from handoff.errors import HandoffError
from handoff.lifecycle import LEAVES, OFF_PATH, UNHEARD, Lifecycle, hookimpl
from handoff.machine import firewall
from handoff.machine.discovery import Layout
from handoff.policies import ABANDONED
from handoff.responses import discovery_plane as plane
from handoff.responses import recovery
from handoff.responses.waits import (
    BROKER_REQUEST_TIMEOUT_S,
    NATS_TIMEOUT_ENV,
    STREAM_TIMEOUT_ENV,
    CaseRun,
    Settings,
)

#: etcd_loss: the lease its processes are given. Each ends itself once its lease runs out, the
#: frontend too; the case's reading of it after the response must come first: under a busy
#: loop, at the file store's 10 s, a response of 900 tokens ended 4.8 s after etcd's kill and
#: the reading took 4.3 s more, past the frontend's end. With 400 tokens (the fault made on a
#: held holder) and 15 s, three times that reading is left.
LOSS_LEASE_S = 15


def on_holder(act, name: str):
    """An injection (`Lifecycle.inject`) of a primitive that acts on the holder alone."""

    def inject(run: CaseRun, holder, watched, _aimed) -> faults.FaultReport:
        return act(name, holder, watched, run.deadline)

    return inject


def drain(name: str, bound, wait, ends_itself: bool, **more) -> Lifecycle:
    """A drain: SIGTERM, and the holder runs on for `bound(settings)` seconds, which the
    request must outlast (`runs_on`); the worker then ends, and is replaced."""
    inject = drained(name, bound, ends_itself)
    return Lifecycle(name, "SIGTERM", inject, left=recovery.gone, wait=wait, runs_on=bound, **more)


def drained(name: str, bound, ends_itself: bool):
    """SIGTERM and a drain of `bound(settings)` seconds (`faults.drain`)."""

    def inject(run: CaseRun, holder, watched, _aimed) -> faults.FaultReport:
        bound_s = bound(run.settings)
        return faults.drain(name, holder, watched, bound_s, ends_itself, run.deadline)

    return inject


def on_broker(name: str, stops: bool):
    def inject(run: CaseRun, holder, watched, _aimed) -> faults.FaultReport:
        broker = run.deployment.pool.nats
        return faults.fault_broker(name, stops, holder, watched, broker, run.deadline)

    return inject


#: Where most of the discovery plane's faults have their workers register: etcd of one member.
ETCD = Layout("etcd", 1)


def on_etcd(name, first_signal, act, aftermath, layout=ETCD, **more) -> Lifecycle:
    """A fault of the discovery plane: `act` on etcd or the holder's lease, made with the
    holder held (`discovery_plane.on_etcd`), off the response's path, its workers on etcd."""
    inject = plane.on_etcd(act)
    return Lifecycle(
        name, first_signal, inject, aftermath=aftermath, meets=OFF_PATH, layout=layout, **more
    )


def of_broker(name: str, stops: bool, aftermath) -> Lifecycle:
    """A fault of the NATS broker under the holder, stopped (`stops`) or killed: off the
    response's path; a new request meanwhile waits on the NATS timeout."""
    return Lifecycle(
        name, "SIGSTOP" if stops else "SIGKILL", on_broker(name, stops), target=broker,
        left=recovery.broker_faulted, aftermath=aftermath, meets=OFF_PATH,
        frontend_env=nats_timeout_env,
    )  # fmt: skip


def unheard(name: str, first_signal: str, act, left, **more) -> Lifecycle:
    """A fault that leaves the holder alive but unheard until healed: only the frontend's
    stream timeout notices it, and the healed worker must serve again."""
    return Lifecycle(
        name, first_signal, on_holder(act, name), left=left, aftermath=recovery.healed_after,
        meets=UNHEARD, wait=silence_wait, frontend_env=stream_timeout_env, **more,
    )  # fmt: skip


def leaves(name: str, first_signal: str, first: Lifecycle | None, **more) -> Lifecycle:
    """A client that closes its stream, after the worker fault `first` (none, a kill, a stall:
    its injection, what it left, whether it stops the holder); what the frontend must count is
    `policies.ABANDONED`'s."""
    worker = {"left": first.left, "stops_holder": first.stops_holder} if first else {}
    inject = first.inject if first else None
    return Lifecycle(
        name, first_signal, inject, meets=LEAVES, outcome=ABANDONED[name], **worker, **more
    )


def graceful_bound(settings: Settings) -> float:
    return settings.graceful_bound_s


def drain_timeout(_: Settings) -> float:
    return faults.DRAIN_TIMEOUT_S


def stream_timeout_env(settings: Settings) -> dict[str, str]:
    """A stall or a partition is silence on the worker's response stream: the frontend's
    inactivity timeout ends it."""
    return {STREAM_TIMEOUT_ENV: str(settings.stream_timeout_s)}


def nats_timeout_env(_: Settings) -> dict[str, str]:
    """A lost broker leaves a new request waiting on NATS: the NATS request timeout ends it."""
    return {NATS_TIMEOUT_ENV: str(BROKER_REQUEST_TIMEOUT_S)}


def silence_wait(settings: Settings) -> tuple[float, str]:
    """Twice the stream timeout: the HTTP layer's, as the router gives up at once."""
    seconds = settings.stream_timeout_s
    return 2 * seconds, f"twice its {seconds} s stream timeout and "


def graceful_wait(settings: Settings) -> tuple[float, str]:
    return settings.graceful_bound_s, f"its {settings.graceful_bound_s:g} s graceful bound, "


def drain_wait(_: Settings) -> tuple[float, str]:
    return faults.DRAIN_TIMEOUT_S, f"its worker's {faults.DRAIN_TIMEOUT_S} s drain timeout, "


def engine_wait(_: Settings) -> tuple[float, str]:
    return faults.ENGINE_NOTICE_S, f"its worker's engine monitor ({faults.ENGINE_NOTICE_S:g} s), "


def broker(run: CaseRun, _holder):
    """The deployment's nats-server, which the broker's faults signal."""
    if (nats := run.deployment.pool.nats) is None:
        raise HandoffError(f"{run.case.fault} needs the deployment's nats-server: it runs none")
    return nats


WORKER_FAILURE = Lifecycle(
    "worker_failure",
    "SIGKILL",
    on_holder(faults.kill, "worker_failure"),
    left=recovery.gone,
)
WORKER_STALL = unheard(
    "worker_stall", "SIGSTOP", faults.stall, recovery.stopped, past_lease="stall_past_lease",
    stops_holder=True, heals_on_move=True,
)  # fmt: skip
#: The discovery plane's faults on etcd but the lease's expiry (a SIGKILL, which moves).
DISCOVERY_PLANE = (
    on_etcd("lease_revoked", "lease revoke", plane.revoke, plane.revoked_after),
    # Three members, each pinned to a process, to cut one worker off its own.
    on_etcd("etcd_partition", "nftables drop", plane.cut_from_etcd, plane.cut_from_etcd_after,
            Layout("etcd", 3, pinned=True), missing=firewall.missing),
    on_etcd("etcd_member_loss", "SIGKILL", plane.kill_members, plane.member_lost_after,
            Layout("etcd", 3), aim=plane.aim_most_connected),
    # The two that may end the frontend read its gauges themselves, where it still serves.
    on_etcd("etcd_restart", "SIGKILL", plane.restart_members, plane.restarted_after,
            aim=plane.aim_every_member, idle_after=False),
    on_etcd("etcd_loss", "SIGKILL", plane.kill_members, plane.lost_after,
            Layout("etcd", 1, lease_s=LOSS_LEASE_S), aim=plane.aim_every_member,
            idle_after=False),
)  # fmt: skip
LIFECYCLES = (
    WORKER_FAILURE,
    drain("graceful_shutdown", graceful_bound, graceful_wait, ends_itself=False),
    WORKER_STALL,
    # The worker's own drain timeout, shorter than the rest of any such case's request.
    drain(
        "drain_expired",
        drain_timeout,
        drain_wait,
        ends_itself=True,
        worker_env=(
            f"drain{faults.DRAIN_TIMEOUT_S}s",
            {"DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS": str(faults.DRAIN_TIMEOUT_S)},
        ),
    ),
    unheard(
        "partition",
        "nftables drop",
        faults.partition,
        recovery.cut_off,
        heals_on_move=True,
        missing=firewall.missing,
    ),
    of_broker("broker_stall", True, recovery.broker_resumed_after),
    of_broker("broker_loss", False, recovery.broker_restarted_after),
    # Held until the frontend no longer lists the stopped worker: healed only then.
    unheard(
        "stall_past_lease",
        "SIGSTOP",
        faults.stall,
        recovery.stopped,
        stops_holder=True,
        outlives_lease=True,
    ),
    Lifecycle(
        # Dynamo's engine monitor asks the engine's health every 2 s and gives each answer
        # 30 s, then its shutdown 60 s: shorter here, so that a worker that never notices its
        # engine's death is told apart within faults.ENGINE_EXIT_S rather than 92 s.
        "engine_failure",
        "SIGKILL",
        on_holder(faults.kill_engine, "engine_failure"),
        left=recovery.engine_gone,
        wait=engine_wait,
        worker_env=(
            "engine10s",
            {"DYN_ENGINE_HEALTH_CHECK_TIMEOUT": "10", "DYN_ENGINE_HEALTH_SHUTDOWN_TIMEOUT": "10"},
        ),
    ),
    Lifecycle(
        # A SIGKILL, whose lease must then run out by itself: it moves as worker_failure's.
        "lease_expiry",
        "SIGKILL",
        on_holder(faults.kill, "lease_expiry"),
        left=recovery.gone,
        aftermath=plane.lease_expired_after,
        layout=ETCD,
    ),
    *DISCOVERY_PLANE,
    # A client that closes its stream, after the worker fault that comes first: none (it
    # leaves mid-stream), a SIGKILL (it leaves once the successor streams), a SIGSTOP (it
    # leaves while the holder is stopped, with a stall's stream timeout, so that the move the
    # frontend must not make is one it would make had the client stayed).
    leaves("client_close", "close", None),
    leaves("close_after_move", "SIGKILL", WORKER_FAILURE, leaves_once_moved=True),
    leaves("close_in_stall", "SIGSTOP", WORKER_STALL, frontend_env=stream_timeout_env),
)


@hookimpl
def register_lifecycles(register) -> None:
    for lifecycle in LIFECYCLES:
        register(lifecycle)
