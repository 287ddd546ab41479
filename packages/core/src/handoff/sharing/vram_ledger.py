"""The machine-wide VRAM ledger: which running case holds how much of which GPU, so that
concurrent pytest-xdist workers, and concurrent runs, never place more than the budget.

The ledger is one JSON file beside handoff's port leases (`ports.lease_dir()`), read and written
only under an exclusive flock of `vram-ledger.lock` there. A `Reservation` names its holder
process (pid and start time, from /proc): a holder that is gone, even by SIGKILL, or whose pid
now belongs to another process, no longer counts; its entry is dropped at the next read.

`take(demand, deadline)` tries, under the lock: read the reservations, read NVML now, work out
each GPU's `placement.Room`, pick the best fit, write the reservation. If nothing fits it lets
go of the lock and tries again (`polling.poll_until`) until the deadline, then fails saying
what holds the memory. `release` drops the reservation; release it once the processes on it
are gone (their memory goes with them). `take(..., yielding=r)` counts the room of `r`, a
reservation of this process whose processes stop before the new one's start, as free for the
new one (and for it alone: `r` stays in the ledger until released).

A `Hold` is a reservation in use in this process: by the case that took it and by every pool
whose workers started under it (`hold_of` their environment, which names its token). It is
released when the last of them leaves, so a pool's reservation lives as long as its workers,
over every case that draws them, and follows their GPU.

What other processes use ("foreign"), per GPU, from NVML at that moment:
- where NVML lists per-process use and every pid it lists exists here: the device's used bytes
  minus what the holders' process trees use, that part capped at what they reserved (a process
  of ours that outgrew its marker, or was left behind, counts as someone else's);
- otherwise (no per-process accounting, or host pids seen from a container): the device's
  used bytes minus the reservations, at least zero. That under-counts others while our own
  cases are still below their markers: the budget still holds, the total may be tight.

Only the standard library is used; NVML comes in as a `gpu.Nvml`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from handoff.machine.polling import Deadline, poll_until
from handoff.machine.ports import lease_dir
from handoff.sharing import placement
from handoff.sharing.nvml import Device, Nvml, cuda_env, gib
from handoff.sharing.placement import Demand, Room

LEDGER_FILE = "vram-ledger.json"
LOCK_FILE = "vram-ledger.lock"
#: The token of the reservation that the processes started with it run under.
RESERVATION_ENV = "HANDOFF_VRAM_RESERVATION"


@dataclass(frozen=True)
class Reservation:
    token: str
    key: str  # the case, or the pool, it is held for
    gpu: int  # Device.index
    gib: float
    whole_gpu: bool
    pid: int  # the holder: the process that runs the case (a pytest worker)
    started: int | None  # the holder's start time, in clock ticks since boot


def start_time(pid: int) -> int | None:
    """The process's start time from /proc/<pid>/stat (field 22); None if there is no such
    process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rpartition(")")[2].split()[19])


def alive(reservation: Reservation) -> bool:
    return start_time(reservation.pid) == reservation.started


def process_trees(roots: set[int]) -> set[int]:
    """`roots` and every process descended from them, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(text.rpartition(")")[2].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(roots), list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class GpuLedger:
    """Reservations of GPU memory by running cases, shared by every handoff process here."""

    def __init__(self, nvml: Nvml, budget_gib: float | None = None, folder: Path | None = None):
        self.nvml = nvml
        self.budget_gib = budget_gib
        self.folder = folder or lease_dir()
        self.folder.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Read-only: enough to lock, and opens the file whoever made it (root in a container).
        fd = os.open(self.folder / LOCK_FILE, os.O_CREAT | os.O_RDONLY, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def _read(self) -> list[Reservation]:
        try:
            entries = json.loads((self.folder / LEDGER_FILE).read_text())["reservations"]
        except (OSError, ValueError, KeyError):
            return []
        return [r for r in (Reservation(**e) for e in entries) if alive(r)]

    def _write(self, reservations: list[Reservation]) -> None:
        path = self.folder / LEDGER_FILE
        temporary = path.with_name(f"{LEDGER_FILE}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o666)
        with os.fdopen(fd, "w") as out:
            json.dump({"reservations": [asdict(r) for r in reservations]}, out)
        os.replace(temporary, path)

    def held(self) -> list[Reservation]:
        with self._locked():
            return self._read()

    def rooms(self, reservations: list[Reservation] | None = None) -> list[Room]:
        """Every visible GPU as placement sees it now."""
        if reservations is None:
            reservations = self.held()
        ours = process_trees({r.pid for r in reservations}) if reservations else set()
        return [self._room(d, reservations, ours) for d in self.nvml.devices()]

    def _room(self, device: Device, reservations: list[Reservation], ours: set[int]) -> Room:
        here = [r for r in reservations if r.gpu == device.index]
        reserved = sum(r.gib for r in here)
        processes = self.nvml.processes(device.index)
        if processes is not None and all(Path(f"/proc/{p.pid}").exists() for p in processes):
            mine = gib(sum(p.used for p in processes if p.pid in ours))
            foreign = gib(device.used) - min(mine, reserved)
        else:
            foreign = max(0.0, gib(device.used) - reserved)
        total = gib(device.total)
        return Room(
            index=device.index,
            total_gib=total,
            budget_gib=total if self.budget_gib is None else min(self.budget_gib, total),
            reserved_gib=reserved,
            foreign_gib=max(0.0, foreign),
            holders=len(here),
            whole=any(r.whole_gpu for r in here),
        )

    def try_take(
        self, demand: Demand, yielding: Reservation | None = None
    ) -> tuple[Reservation | None, list[Room]]:
        """One attempt: the reservation made, or None, with the GPUs as they were seen."""
        with self._locked():
            reservations = self._read()
            rooms = self.rooms(reservations)
            if yielding in reservations:
                freed = Demand(yielding.key, yielding.gib, whole_gpu=yielding.whole_gpu)
                rooms = [
                    placement.give_back(r, freed) if r.index == yielding.gpu else r for r in rooms
                ]
            room = placement.best_fit(demand, rooms)
            if room is None:
                return None, rooms
            me = os.getpid()
            made = Reservation(
                f"{me}-{uuid.uuid4().hex[:12]}",
                demand.key,
                room.index,
                demand.vram_gib,
                demand.whole_gpu,
                me,
                start_time(me),
            )
            self._write([*reservations, made])
            return made, rooms

    def take(
        self, demand: Demand, deadline: Deadline, yielding: Reservation | None = None
    ) -> Reservation:
        """Wait until `demand` fits a GPU, and reserve it there; Timeout (a CaseFailure) at
        the deadline, saying what holds the memory. `yielding`: see the module docstring."""

        def attempt() -> tuple[Reservation | None, str]:
            made, rooms = self.try_take(demand, yielding)
            return made, describe(rooms)

        return poll_until(
            attempt, deadline, f"{demand.vram_gib:g} GiB of GPU memory for {demand.key}"
        )

    def release(self, reservation: Reservation) -> None:
        with self._locked():
            self._write([r for r in self._read() if r.token != reservation.token])


class Hold:
    """A reservation and who in this process runs on it; released when the last one leaves."""

    def __init__(self, ledger: GpuLedger, reservation: Reservation) -> None:
        self.ledger = ledger
        self.reservation = reservation
        self.users: set[str] = set()
        _HOLDS[reservation.token] = self

    @property
    def released(self) -> bool:
        return _HOLDS.get(self.reservation.token) is not self

    @property
    def env(self) -> dict[str, str]:
        """What the processes started on it are given: its GPU alone, and its token."""
        return {**cuda_env(self.reservation.gpu), RESERVATION_ENV: self.reservation.token}

    def join(self, user: str) -> None:
        self.users.add(user)

    def leave(self, user: str) -> None:
        self.users.discard(user)
        if not self.users and not self.released:
            del _HOLDS[self.reservation.token]
            self.ledger.release(self.reservation)


#: This process's holds not yet released, by token.
_HOLDS: dict[str, Hold] = {}


def hold_of(env: Mapping[str, str]) -> Hold | None:
    """The hold that processes started with `env` run under; None where it names none (a
    case that needs no GPU) or one already released."""
    return _HOLDS.get(env.get(RESERVATION_ENV, ""))


def describe(rooms: list[Room]) -> str:
    return (
        "; ".join(
            f"GPU {r.index}: {r.reserved_gib:.1f} GiB held by {r.holders} case(s)"
            f"{' (whole GPU)' if r.whole else ''}, "
            f"{r.foreign_gib:.1f} GiB used by other processes, "
            f"{max(0.0, r.free_gib):.1f} GiB free within a {r.capacity_gib:.1f} GiB budget"
            for r in rooms
        )
        or "no GPU visible"
    )
