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
WORKER_STALL = Lifecycle(
    "worker_stall",
    "SIGSTOP",
    on_holder(faults.stall, "worker_stall"),
    past_lease="stall_past_lease",
    left=recovery.stopped,
    aftermath=recovery.healed_after,
    meets=UNHEARD,
    wait=silence_wait,
    stops_holder=True,
    heals_on_move=True,
    frontend_env=stream_timeout_env,
)
LIFECYCLES = (
    WORKER_FAILURE,
    Lifecycle(
        "graceful_shutdown",
        "SIGTERM",
        drained("graceful_shutdown", graceful_bound, False),
        left=recovery.gone,
        wait=graceful_wait,
        runs_on=graceful_bound,
    ),
    WORKER_STALL,
    Lifecycle(
        # The worker's own drain timeout, shorter than the rest of any such case's request.
        "drain_expired",
        "SIGTERM",
        drained("drain_expired", drain_timeout, True),
        left=recovery.gone,
        wait=drain_wait,
        runs_on=drain_timeout,
        worker_env=(
            f"drain{faults.DRAIN_TIMEOUT_S}s",
            {"DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS": str(faults.DRAIN_TIMEOUT_S)},
        ),
    ),
    Lifecycle(
        "partition",
        "nftables drop",
        on_holder(faults.partition, "partition"),
        left=recovery.cut_off,
        aftermath=recovery.healed_after,
        meets=UNHEARD,
        wait=silence_wait,
        heals_on_move=True,
        frontend_env=stream_timeout_env,
        missing=firewall.missing,
    ),
    Lifecycle(
        "broker_stall",
        "SIGSTOP",
        on_broker("broker_stall", stops=True),
        target=broker,
        left=recovery.broker_faulted,
        aftermath=recovery.broker_resumed_after,
        meets=OFF_PATH,
        frontend_env=nats_timeout_env,
    ),
    Lifecycle(
        "broker_loss",
        "SIGKILL",
        on_broker("broker_loss", stops=False),
        target=broker,
        left=recovery.broker_faulted,
        aftermath=recovery.broker_restarted_after,
        meets=OFF_PATH,
        frontend_env=nats_timeout_env,
    ),
    Lifecycle(
        # Held until the frontend no longer lists the stopped worker: healed only then.
        "stall_past_lease",
        "SIGSTOP",
        on_holder(faults.stall, "stall_past_lease"),
        left=recovery.stopped,
        aftermath=recovery.healed_after,
        meets=UNHEARD,
        wait=silence_wait,
        stops_holder=True,
        outlives_lease=True,
        frontend_env=stream_timeout_env,
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
        layout=Layout("etcd", 1),
    ),
    Lifecycle(
        "lease_revoked",
        "lease revoke",
        plane.on_etcd(plane.revoke),
        aftermath=plane.revoked_after,
        meets=OFF_PATH,
        layout=Layout("etcd", 1),
    ),
    Lifecycle(
        # Three members, each pinned to a process, to cut one worker off its own.
        "etcd_partition",
        "nftables drop",
        plane.on_etcd(plane.cut_from_etcd),
        aftermath=plane.cut_from_etcd_after,
        meets=OFF_PATH,
        layout=Layout("etcd", 3, pinned=True),
        missing=firewall.missing,
    ),
    Lifecycle(
        "etcd_member_loss",
        "SIGKILL",
        plane.on_etcd(plane.kill_members),
        aftermath=plane.member_lost_after,
        meets=OFF_PATH,
        layout=Layout("etcd", 3),
        aim=plane.aim_most_connected,
    ),
    Lifecycle(
        "etcd_restart",
        "SIGKILL",
        plane.on_etcd(plane.restart_members),
        aftermath=plane.restarted_after,
        idle_after=False,
        meets=OFF_PATH,
        layout=Layout("etcd", 1),
        aim=plane.aim_every_member,
    ),
    Lifecycle(
        "etcd_loss",
        "SIGKILL",
        plane.on_etcd(plane.kill_members),
        aftermath=plane.lost_after,
        idle_after=False,
        meets=OFF_PATH,
        layout=Layout("etcd", 1, lease_s=LOSS_LEASE_S),
        aim=plane.aim_every_member,
    ),
    # A client that closes its stream, after the worker fault that comes first: none (it
    # leaves mid-stream), a SIGKILL (it leaves once the successor streams), a SIGSTOP (it
    # leaves while the holder is stopped, with a stall's stream timeout, so that the move the
    # frontend must not make is one it would make had the client stayed).
    Lifecycle(
        "client_close",
        "close",
        None,
        meets=LEAVES,
        outcome=ABANDONED["client_close"],
    ),
    Lifecycle(
        "close_after_move",
        "SIGKILL",
        WORKER_FAILURE.inject,
        left=recovery.gone,
        meets=LEAVES,
        outcome=ABANDONED["close_after_move"],
        leaves_once_moved=True,
    ),
    Lifecycle(
        "close_in_stall",
        "SIGSTOP",
        WORKER_STALL.inject,
        left=recovery.stopped,
        meets=LEAVES,
        outcome=ABANDONED["close_in_stall"],
        stops_holder=True,
        frontend_env=stream_timeout_env,
    ),
)


@hookimpl
def register_lifecycles(register) -> None:
    for lifecycle in LIFECYCLES:
        register(lifecycle)
