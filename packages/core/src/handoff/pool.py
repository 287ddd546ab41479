"""Workers that outlive a case: started once per pool, drawn by one case at a time, and the
one a case faulted replaced at once, while other cases run.

A pool is one discovery store (a folder, or an etcd of its own: `machine.discovery`), NATS
server (on the nats plane), model and set of workers for the cases that launch identical
workers: the same backend, roles, request plane, discovery and `Backend.worker_variant`. A case
draws every worker of the pool, exactly the instances its topology expects, and starts its own
frontend on them (its policy, its counters from zero). A worker is handed out only when it is
alive, registered, answering and holds no request. When the case ends, the worker it faulted is
gone: its tree and ports are checked gone (a problem fails that case), its discovery entries
are removed, so no frontend lists or routes to it, and a spare takes its place. A case that
fails discards the pool.

Spares (on the file store only): a spare worker of the role cases fault starts with a discovery
folder of its own, so no frontend sees it while it waits (and the running case's frontend lists
exactly its own workers). From the hand-over until it exits, a thread mirrors its folder into
the pool's (`registrations.Mirror`): each entry is hard-linked there, so Dynamo's keep-alive,
which touches the file in place, freshens both (measured on Dynamo 1.6.1, docs/known-
issues.md); an entry it rewrites by rename is linked anew, and one it deletes (a drain) is
deleted there, so a frontend sees it as it sees a worker started in the pool's folder. In a
pool that keeps spares, the successor of the worker a case faulted starts as a spare the moment
that worker is gone, in the background of the rest of the case; when the case ends the oldest
spare takes its place. With no spare, the successor starts when the case has ended, and the
next case waits for it. Where the run says how many cases a pool will serve
(`Pools(planned=...)`), no spare or successor is started for a case that will not come: a pool
of four aggregate cases with one spare starts five workers in all, not seven.

A fresh deployment (`--handoff-fresh`) is a pool of its own, used by one case and stopped.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections import Counter
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import psutil

from handoff import lifecycle, metrics, releases
from handoff.backend import Backend, Model, Worker
from handoff.cases import Case, topology
from handoff.errors import CaseFailure, HandoffError
from handoff.machine import etcd, registrations, services
from handoff.machine.discovery import FILE, Discovery, EtcdDiscovery, FileDiscovery, Layout
from handoff.machine.polling import POLL_INTERVAL_S, Deadline, Timeout, poll_until
from handoff.machine.ports import PortLeases, bindable, listener
from handoff.machine.preload import Preloader
from handoff.machine.processes import ManagedProcess
from handoff.machine.wallclock import WallClock
from handoff.releases import mixes
from handoff.sharing import vram_ledger

TEARDOWN_TIMEOUT_S = 15.0
#: Pools are numbered in the order a process starts them, whatever `Pools` starts them.
POOL_SERIAL = count(1)


class StartupFailure(CaseFailure):
    """A process exited, or the workers never became ready."""


@dataclass(frozen=True)
class PoolKey:
    """What makes workers interchangeable between cases."""

    backend: str
    roles: tuple[str, ...]
    plane: str
    variant: tuple
    #: Where the workers register.
    discovery: Layout = FILE

    @classmethod
    def of(cls, backend: Backend, case: Case, roles: tuple[str, ...]) -> PoolKey:
        own = lifecycle.of(case.fault).worker_env
        variant = (*backend.worker_variant(case), *((own[0],) if own else ()))
        chosen = str(backend.setting("discovery"))
        layout = lifecycle.layout(case.fault, chosen, topology(case.topology).on_etcd)
        return cls(backend.name, roles, case.plane, variant, layout)

    @property
    def label(self) -> str:
        """A readable name: backend, roles, plane, the variant and a discovery other than the
        file store, e.g. for xdist groups."""
        variant = "-".join(str(v) for v in self.variant)
        parts = [self.backend, "+".join(self.roles), self.plane, variant, self.discovery.label]
        return "-".join(filter(None, parts))


class Pool:
    """Services and workers shared by the cases of one key, in a folder of its own."""

    def __init__(
        self,
        backend: Backend,
        case: Case,
        roles: tuple[str, ...],
        folder: Path,
        spares: int = 0,
        cases: int | None = None,
        discovery: Layout = FILE,
    ):
        self.backend = backend
        #: The case whose launch every worker of the pool gets: its key's first.
        self.case = case
        self.roles = roles
        self.folder = folder
        self.leases = PortLeases()
        self.processes: list[ManagedProcess] = []
        self.workers: list[Worker] = []
        self.model: Model | None = None
        self.env: dict[str, str] = {}
        self.nats_port: int | None = None
        self.nats: ManagedProcess | None = None
        #: The warm interpreter the pool's Dynamo processes are forked from.
        self.preloader: Preloader | None = None
        #: Each live worker's instance ids in the discovery store, once it has registered.
        self.instance_ids: dict[str, set[int]] = {}
        #: Cases drawn so far: the next case's prompt variant.
        self.draws = 0
        self.spare_count = spares
        #: How many cases the pool will serve, where the run knows: no worker is started
        #: for a case that will not come.
        self.cases = cases
        #: Workers started in a discovery folder of their own, not yet handed to a case.
        self.spares: list[Worker] = []
        #: The drawn workers, gone, whose successors have started.
        self.replaced: set[str] = set()
        #: The workers that have served a request to warm them (`Deployment._warm`).
        self.warmed: set[str] = set()
        #: Worker name -> the folder it registers in, for spares and the spares handed over.
        self.own_store: dict[str, Path] = {}
        #: The spares handed over and still running, each with its folder's mirror, and the
        #: thread that syncs them (`_keep_mirroring`); what stopped it, if anything did.
        self.mirrors: dict[str, tuple[ManagedProcess, registrations.Mirror]] = {}
        self._mirroring = threading.Lock()
        self._stop_mirroring = threading.Event()
        self._mirror_thread: threading.Thread | None = None
        self.mirror_failure: str | None = None
        self._serial = count()
        #: The settings' mix of two releases, if any.
        self.mix = mixes.configured(backend.setting("mix"), backend.setting("beside"))
        #: The GPU reservation the workers run under, if the case that started them had one.
        self.gpu: vram_ledger.Hold | None = None
        #: Whether the wall clock, which the workers' discovery leases run on, held.
        self.clock = WallClock()
        #: Where the workers register: its layout, and the store itself once started.
        self.layout = discovery
        self.discovery: Discovery | None = None
        self.etcd: etcd.Cluster | None = None
        #: Worker name -> the etcd member it was given, in a pinned layout.
        self.pinned: dict[str, etcd.Member] = {}

    @property
    def name(self) -> str:
        """The pool's folder's name, e.g. `gw0-3-mocker-aggregate+aggregate-tcp-1.0-0.0`."""
        return self.folder.name

    @property
    def started(self) -> bool:
        return bool(self.env)

    def start(self) -> None:
        """Launch NATS (on the nats plane) and every worker; `draw` waits for them."""
        self.backend.check_environment()
        shutil.rmtree(self.folder / "nats", ignore_errors=True)
        self.model = self.backend.prepare_model(self.folder / "model")
        if self.model.path is not None and not self.model.path.is_dir():
            raise HandoffError(
                f"the model folder {self.model.path} of {self.backend.name} does not exist: "
                "fix the backend's model_path setting (handoff config shows where it came from)"
            )
        # Where the release's event plane cannot keep to loopback, events go through NATS.
        loose = [releases.current()] + ([releases.facts(self.mix.release)] if self.mix else [])
        nats = self.case.plane == "nats" or not all(f.event_plane_on_loopback for f in loose)
        self.nats_port = self.leases.take() if nats else None
        self.discovery = self._discovery()
        self.env = services.runtime_env(
            self.discovery.env(), self.nats_port, releases.current().loopback_env
        )
        modules = {**services.PRELOADED, **self.backend.preloaded}
        log = self.folder / "preloader.log"
        self.preloader = Preloader(modules, services.PRELOADED_BASE, self.env, log)
        self.preloader.start()
        self._hold_gpu()
        if self.nats_port is not None:
            nats = services.nats_command(self.nats_port, self.folder / "nats")
            self.nats = self._spawn("nats-server", nats)
        if self.etcd is not None:
            self.etcd.start()
            self.etcd.wait_ready(Deadline(etcd.READY_TIMEOUT_S))
        self.workers = [self._start_worker(role) for role in self.roles]
        target = topology(self.case.topology).target_role
        if target in self.roles:
            wanted = self._spares_after_next_draw()
            self.spares = [self._start_worker(target, spare=True) for _ in range(wanted)]

    def _discovery(self) -> Discovery:
        if self.layout.kind == "file":
            return FileDiscovery(self.folder / "discovery")
        members = etcd.members(self.leases.take, self.layout.members)
        self.etcd = etcd.Cluster(members, self._spawn, self.layout.lease_s)
        return EtcdDiscovery(self.etcd)

    def restart_nats(self) -> None:
        """Start nats-server again on the pool's port, with its store, after a case killed it:
        the workers and later cases of the pool reconnect to it there."""
        assert self.nats is not None and self.nats_port is not None
        self.processes.remove(self.nats)
        nats = services.nats_command(self.nats_port, self.folder / "nats")
        self.nats = self._spawn("nats-server", nats)

    def _spares_after_next_draw(self) -> int:
        """The spares to keep once the next case has drawn: `spare_count`, but none for a case
        the run will not bring."""
        if self.cases is None:
            return self.spare_count
        return min(self.spare_count, max(self.cases - self.draws - 1, 0))

    @property
    def usable(self) -> bool:
        """Whether later cases may draw from the pool: not once a member of its etcd is gone
        for good (`etcd_loss`: its workers end themselves)."""
        return self.etcd is None or all(self.etcd.alive(m) for m in self.etcd.members)

    @property
    def spent(self) -> bool:
        """Whether the pool has served every case the run planned for it."""
        return self.cases is not None and self.draws >= self.cases

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None, nice: int = 0):
        env = {**self.env, **(env or {})}
        process = ManagedProcess(name, argv, env, self.folder / f"{name}.log", nice, self.preloader)
        self.processes.append(process)
        process.start()
        return process

    def _start_worker(self, role: str, spare: bool = False, joining: bool = False) -> Worker:
        assert self.model is not None
        ports = {name: self.leases.take() for name in self.backend.ports_of(role)}
        serial = next(self._serial)
        beside = self.runs_beside("worker", role, serial, joining)
        with self.launching(beside):
            launch = self.backend.worker(role, self.case, self.model, ports, self.folder)
        name = f"worker-{serial}-{role}"
        own = lifecycle.of(self.case.fault).worker_env
        env = {**launch.env, **(own[1] if own else {}), **self.beside_env(beside)}
        if spare and self.layout.keeps_spares_unseen:
            self.own_store[name] = self.folder / f"{name}-discovery"
            env["DYN_FILE_KV"] = str(self.own_store[name])
        if self.layout.pinned:
            env["ETCD_ENDPOINTS"] = self._pin(name).client_url
        argv = self.mix.argv(list(launch.argv), True) if self.mix and beside else list(launch.argv)
        process = self._spawn(name, argv, env, launch.niceness)
        return Worker(name, role, process, ports, self.backend.engine_core)

    def _pin(self, name: str) -> etcd.Member:
        """The member worker `name` is given (`Layout.pinned`): one no live worker has, of all
        but the last (the frontend's)."""
        assert self.etcd is not None
        live = {p.name for p in self.processes if p.exit_code() is None}
        taken = {m.name for worker, m in self.pinned.items() if worker in live}
        free = [m for m in self.etcd.members[:-1] if m.name not in taken]
        if not free:
            raise HandoffError(
                f"no etcd member is free for {name}: every one but the last is taken"
            )
        self.pinned[name] = free[0]
        return free[0]

    def frontend_env(self) -> dict[str, str]:
        """What a frontend's environment has beyond the pool's: its own member when pinned."""
        if not self.layout.pinned:
            return {}
        assert self.etcd is not None
        return {"ETCD_ENDPOINTS": self.etcd.members[-1].client_url}

    def _hand_over(self, worker: Worker) -> None:
        """Mirror a spare's folder into the pool's from now until it exits: synced at once,
        then by the pool's mirror thread."""
        own = self.own_store.get(worker.name)
        if own is None or worker.name in self.mirrors or worker.process.exit_code() is not None:
            return
        with self._mirroring:
            mirror = registrations.Mirror(own, self.discovery.store)
            mirror.sync()
            self.mirrors[worker.name] = (worker.process, mirror)
        if self._mirror_thread is None:
            self._mirror_thread = threading.Thread(
                target=self._keep_mirroring, name=f"mirror-{self.name}", daemon=True
            )
            self._mirror_thread.start()

    def _keep_mirroring(self) -> None:
        """Sync every mirror each poll interval until the pool stops. A spare that has exited
        is synced once more (what its drain deleted) and mirrored no longer: its entries that
        remain are a dead worker's, left to `give_back` as in a worker started here."""
        try:
            while not self._stop_mirroring.wait(POLL_INTERVAL_S):
                with self._mirroring:
                    for name, (process, mirror) in list(self.mirrors.items()):
                        exited = process.exit_code() is not None  # read before its last sync
                        mirror.sync()
                        if exited:
                            del self.mirrors[name]
        except Exception as exc:  # reported by give_back: it fails the case
            self.mirror_failure = f"the discovery mirror stopped: {type(exc).__name__}: {exc}"

    def draw(self, case: Case, deadline: Deadline) -> list[Worker]:
        """Every worker, once each is alive, registered and known idle: the instances of one
        case. A worker that holds a request or does not answer is waited for until `deadline`,
        then the case fails naming it (docs/architecture.md, "Warm worker pools")."""
        if self.draws:  # the first case's workers were launched for it
            self._check_same_launch(case)

        def probe() -> tuple[list[Worker] | None, str]:
            self.raise_if_exited()
            waiting = []
            for worker in self.workers:
                self._hand_over(worker)
                try:
                    ids = self.discovery.instance_ids(worker.ports["system"])
                except etcd.Unanswered as exc:  # unknown: not known to be registered
                    ids, worker_seen = set(), str(exc)
                else:
                    worker_seen = "not registered"
                if ids:
                    self.instance_ids[worker.name] = ids
                else:
                    waiting.append(f"{worker.name} {worker_seen}")
            if not waiting:  # one look at all of them, as the search for the holder does
                try:
                    busy = self.backend.holders(self.workers)
                except metrics.Unanswered as exc:  # silent: not known to be idle
                    waiting = [str(exc)]
                else:
                    waiting = [f"{w.name} holds a request" for w in busy]
            return (None if waiting else list(self.workers)), "; ".join(waiting)

        drawn = poll_until(probe, deadline, "the pool's workers to be registered and idle")
        self.draws += 1
        return drawn

    def _check_same_launch(self, case: Case) -> None:
        """A backend whose launch depends on more of the case than its `worker_variant` says
        would hand a case workers started for another: refuse, naming the fix."""
        assert self.model is not None
        for worker in self.workers:
            beside = self.mix is not None and worker.process.argv[0] == self.mix.python
            with self.launching(beside):  # as it was launched: its engine file is rewritten
                launch = self.backend.worker(
                    worker.role, case, self.model, worker.ports, self.folder
                )
            if list(launch.argv)[1:] != worker.process.argv[1:]:  # a mix sets the interpreter
                raise HandoffError(
                    f"backend {self.backend.name!r} launches {case.key}'s {worker.role} worker "
                    f"unlike its pool's: its worker_variant must name what differs "
                    f"(or run with --handoff-fresh)"
                )

    def replace(self, worker: Worker) -> Worker | None:
        """Start the successor of a drawn worker that is gone, at once, in the background of
        the rest of its case: as a spare, in a discovery folder of its own, so the case's
        frontend never lists it. None when the worker still runs or has its successor."""
        if worker.process.exit_code() is None or worker.name in self.replaced:
            return None
        self.replaced.add(worker.name)
        waiting = [s for s in self.spares if s.role == worker.role]
        # One to take its place in the next case (if one comes), and the spares after that.
        wanted = 0 if self.spent else 1 + self._spares_after_next_draw()
        if len(waiting) >= wanted:
            return None
        successor = self._start_worker(worker.role, spare=True)
        self.spares.append(successor)
        return successor

    def add_worker(self, role: str) -> Worker:
        """A worker of `role` started now in the pool's own discovery folder, so that a running
        frontend lists it once it registers: a replacement in a soak (benchmarks/load_soak.py)."""
        return self._start_worker(role, joining=True)

    def runs_beside(self, *place) -> bool:
        """Whether the process at `place` runs the mix's other release (`Mix.runs_beside`)."""
        return self.mix is not None and self.mix.runs_beside(*place)

    def launching(self, beside: bool) -> contextlib.AbstractContextManager:
        """Where a process is launched as its release's entry says: the other release's for a
        process run beside (`releases.launching`)."""
        if self.mix is None or not beside:
            return contextlib.nullcontext()
        return releases.launching(self.mix.release)

    def beside_env(self, beside: bool) -> dict[str, str]:
        """The variables that keep a process of the other release on loopback, over the
        pool's (which are the installed release's)."""
        return dict(releases.facts(self.mix.release).loopback_env) if self.mix and beside else {}

    def beside(self, processes: list[ManagedProcess]) -> dict[str, str]:
        """Those of `processes` that ran the mix's other release: name -> release."""
        mix = self.mix
        return {p.name: mix.release for p in processes if mix and p.argv[0] == mix.python}

    def replace_beside_case(self, worker: Worker) -> Worker | None:
        """`replace` while the worker's case still runs; a pool that keeps no spare leaves it
        to `give_back`, so that nothing but the case's own processes runs beside the case
        (on a small machine every busy worker slows the case)."""
        return self.replace(worker) if self.spare_count else None

    def give_back(self, drawn: list[Worker]) -> tuple[list[str], list[str]]:
        """Take back a case's workers: each one that is gone has its tree and ports checked gone
        (what is left of its tree is killed, as a fresh deployment's teardown would), its
        discovery entries removed and its successor started (unless `replace` did), and the
        oldest spare of its role takes its place. Returns the entries removed, and the problems
        found: each fails the case."""
        gone = [w for w in drawn if w.process.exit_code() is not None]
        ports = [port for w in gone for port in w.ports.values()]
        problems = stop_trees([w.process for w in gone], ports)
        if self.mirror_failure:
            problems.append(self.mirror_failure)
        if not self.usable:  # discarded before another case: no successor, nothing to remove
            return [], problems
        removed = []
        for worker in gone:
            removed += self.discovery.remove(self.instance_ids.pop(worker.name, set()))
            self.replace(worker)
            spare = next((s for s in self.spares if s.role == worker.role), None)
            if spare is None:  # spent: no case will draw its workers again
                continue
            self.spares.remove(spare)
            self.workers[self.workers.index(worker)] = spare
        return removed, problems

    def raise_if_exited(self) -> None:
        """Fail with the name, exit code and log tail of the first live process that exited."""
        live = [w.process for w in self.workers + self.spares]
        members = [m.process for m in self.etcd.members] if self.etcd else []
        for process in ([self.nats] if self.nats else []) + members + live:
            code = process.exit_code()
            if code is not None:
                raise StartupFailure(
                    f"{process.name} exited with code {code} during start-up; "
                    f"log {process.log_path}:\n{process.log_tail()}"
                )

    def _hold_gpu(self) -> None:
        """Hold the GPU reservation of the environment the workers start in (the case's,
        handoff.sharing.scheduling), over every case that draws them."""
        self.gpu = vram_ledger.hold_of(self.env)
        if self.gpu is not None:
            self.gpu.join(self.name)

    def _release_gpu(self) -> None:
        """Let go of it once the workers are gone: their memory went with them."""
        if self.gpu is not None:
            self.gpu.leave(self.name)

    def stop(self) -> list[str]:
        """Kill every process the pool started; returns the problems found (survivors, ports
        still bound); empty means clean."""
        self._stop_mirroring.set()
        if self._mirror_thread is not None:
            self._mirror_thread.join()
        problems = stop_all(self.processes, self.leases)
        if self.etcd is not None and not problems:  # once its members are gone for sure
            problems += self.etcd.remove_data()
        if self.preloader is not None:  # once everything it forked is gone
            problems += self.preloader.stop(TEARDOWN_TIMEOUT_S)
        self._release_gpu()
        return problems


def stop_all(processes: list[ManagedProcess], leases: PortLeases) -> list[str]:
    """`stop_trees` on every leased port, then release the leases."""
    problems = stop_trees(processes, leases.ports)
    leases.release()
    return problems


def stop_trees(
    processes: list[ManagedProcess], ports: list[int], deadline: Deadline | None = None
) -> list[str]:
    """SIGKILL every tree at once, wait until all are gone and every port is free (a SIGKILLed
    process frees its sockets as its threads exit), until `deadline` (default: the teardown's
    own); the problems found, each naming its holder."""
    problems = []
    deadline = deadline or Deadline(TEARDOWN_TIMEOUT_S)
    started = [p for p in reversed(processes) if p.popen is not None]
    for process in started:  # signal every tree first, then wait: they die in parallel
        process.kill()
    for process in started:
        if survivors := process.wait_gone(deadline):
            pids = ", ".join(str(p.pid) for p in survivors)
            problems.append(f"{process.name} still alive after SIGKILL: pids {pids}")
    try:
        poll_until(
            lambda: (True, None) if not (busy := _busy(ports)) else (None, busy),
            deadline,
            "the ports to be free",
        )
    except Timeout:
        # Name the holder: a survivor of the trees, or a child that escaped them (detached).
        problems += [
            f"port {port} still bound {TEARDOWN_TIMEOUT_S:g} s after teardown, by {listener(port)}"
            for port in _busy(ports)
        ]
    return problems


def _busy(ports: list[int]) -> list[int]:
    return [port for port in ports if not bindable(port)]


class Pools:
    """The pool of one pytest process: one at a time, since a pool's cases run one after
    another (handoff.sharing.scheduling) and an idle worker is not free everywhere (a vLLM
    worker on a CPU holds gigabytes of memory). Nothing outlives `close()`; a pool's logs stay
    only where a case failed on it, or everywhere with `keep_logs`."""

    def __init__(
        self,
        folder: Path,
        tag: str = "",
        keep_logs: bool = False,
        planned: Counter[PoolKey] | None = None,
    ) -> None:
        self.folder = folder
        self.tag = tag
        self.keep_logs = keep_logs
        #: The cases of each key this process will run, where known; `pool_for` counts them off.
        self.planned = planned
        self.current: tuple[PoolKey, Pool] | None = None
        #: Problems found stopping pools that no case failed in; `close()` reports them.
        self.problems: list[str] = []

    def pool_for(self, backend: Backend, case: Case, roles: tuple[str, ...]) -> Pool:
        """The pool of `case`'s key; a new one, not started yet, in place of the last when that
        served another key, or as many cases as the backend has distinct prompts."""
        key = PoolKey.of(backend, case, roles)
        if self.current is not None:
            last_key, last = self.current
            if (
                last_key != key
                or last.draws >= backend.distinct_prompts
                or last.spent
                or not last.usable
            ):
                self.problems += [f"pool {last.name}: {p}" for p in self.discard(last)]
        if self.current is None:
            name = f"{self.tag}{next(POOL_SERIAL)}-{key.label}"
            spares = backend.spare_workers(case) if key.discovery.keeps_spares_unseen else 0
            planned = self.planned[key] if self.planned is not None else 0
            cases = min(planned, backend.distinct_prompts) if planned > 0 else None
            pool = Pool(backend, case, roles, self.folder / name, spares, cases, key.discovery)
            self.current = (key, pool)
        if self.planned is not None:
            self.planned[key] -= 1
        return self.current[1]

    def live_processes(self) -> list[psutil.Process]:
        """Every process of the current pool, children included."""
        if self.current is None:
            return []
        pool = self.current[1]
        preloader = pool.preloader.tree() if pool.preloader is not None else []
        return [*preloader, *(proc for process in pool.processes for proc in process.tree())]

    def discard(self, pool: Pool, keep_in: Path | None = None) -> list[str]:
        """Stop `pool` for good; its logs move into `keep_in` (a failed case's folder), or stay
        where they are with `keep_logs`, or go."""
        if self.current is not None and self.current[1] is pool:
            self.current = None
        problems = pool.stop()
        if keep_in is not None and pool.folder.exists():
            keep_in.mkdir(parents=True, exist_ok=True)
            shutil.move(pool.folder, keep_in / f"pool-{pool.name}")
        elif not self.keep_logs:
            shutil.rmtree(pool.folder, ignore_errors=True)
        return problems

    def copy_logs(self, pool: Pool, into: Path) -> None:
        """A copy of `pool`'s logs as they stand, where a discard would move them, for a case
        that keeps its logs while its pool goes on (a case not proven)."""
        for log in pool.folder.rglob("*.log"):
            target = into / f"pool-{pool.name}" / log.relative_to(pool.folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, target)

    def close(self) -> list[str]:
        """Stop the current pool; every problem found stopping pools, each naming its pool."""
        if self.current is not None:
            pool = self.current[1]
            self.problems += [f"pool {pool.name}: {p}" for p in self.discard(pool)]
        return self.problems
