"""Placement of cases on GPUs and CPU slots: pure functions of demands, GPUs and budgets, no I/O.

A case's `Demand` comes from its markers: `profiled_vram_gib` (the peak GPU memory of its whole
deployment, 0 or absent for the mocker), `timeout` (the most it may take) and optionally
`whole_gpu` (it owns a GPU alone). A `Room` is one GPU at one moment: its total, the budget
handoff's cases may hold on it (`--max-vram-gib`, never above the total), what placements
hold there now, and what other processes use (the driver's own share, other tenants).

The rules, the same for the run-time ledger and the dry-run plan:

- A demand fits a GPU when reserved + demand <= budget (handoff's own share) and
  reserved + foreign + demand <= total (what is physically left with other tenants there).
  A `whole_gpu` demand fits only a GPU no placement holds, and nothing joins it there.
- Best fit: of the GPUs it fits, the one left with the least room, then the lowest index.
- Longest first: cases start in the order of their timeout markers, longest first (a stable
  sort: equal timeouts keep their order), so the long ones do not end up alone at the end.
- A case that needs more than the budget or the total of every GPU is refused, with the
  reason; so is one that needs a GPU where none is visible. Refusal reads budgets and totals
  only, never live use: every pytest-xdist worker refuses the same cases, and memory another
  tenant holds for a while makes a case wait, not vanish.
- Cases with 0 GiB need a CPU slot only.

`plan` simulates a run for `--dry-run`: each slot takes the next case in longest-first order;
a case that does not fit yet holds its slot and waits (as a pytest-xdist worker waiting on the
ledger does) until cases that end free enough memory; a case runs for its timeout (the only
duration known before running it). Memory others use now is assumed to stay; a case that could
start only if it went away is listed as blocked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

#: Float slack when comparing GiB sums.
EPS = 1e-9


@dataclass(frozen=True)
class Demand:
    key: str
    vram_gib: float = 0.0
    timeout_s: float = 0.0
    whole_gpu: bool = False

    @property
    def needs_gpu(self) -> bool:
        return self.vram_gib > 0 or self.whole_gpu


@dataclass(frozen=True)
class Room:
    """One GPU at one moment, in GiB."""

    index: int
    total_gib: float
    budget_gib: float  # what handoff's cases may hold here, at most the total
    reserved_gib: float = 0.0  # held by placements
    foreign_gib: float = 0.0  # used by everything else: the driver, other tenants
    holders: int = 0  # placements here
    whole: bool = False  # one placement owns it alone

    @property
    def free_gib(self) -> float:
        """What one more placement may take here now."""
        budget = min(self.budget_gib, self.total_gib)
        return min(
            budget - self.reserved_gib, self.total_gib - self.foreign_gib - self.reserved_gib
        )

    @property
    def capacity_gib(self) -> float:
        """The most one case may ever take here: the budget, or the total when smaller."""
        return min(self.budget_gib, self.total_gib)


def fits(demand: Demand, room: Room) -> bool:
    if room.whole or (demand.whole_gpu and room.holders):
        return False
    return demand.vram_gib <= room.free_gib + EPS


def best_fit(demand: Demand, rooms: Iterable[Room]) -> Room | None:
    """The GPU `demand` fits that is left with the least room; None when it fits none now."""
    candidates = [r for r in rooms if fits(demand, r)]
    return min(candidates, key=lambda r: (r.free_gib - demand.vram_gib, r.index), default=None)


def refusal(demand: Demand, rooms: Sequence[Room]) -> str | None:
    """Why `demand` can never run on these GPUs under this budget; None when it can."""
    if not demand.needs_gpu:
        return None
    if not rooms:
        return f"it needs {demand.vram_gib:g} GiB of GPU memory and no GPU is visible"
    most = max(r.capacity_gib for r in rooms)
    if demand.vram_gib > most + EPS:
        limits = ", ".join(
            f"GPU {r.index}: {r.capacity_gib:.1f} GiB"
            + (" (budget)" if r.budget_gib < r.total_gib else " (total)")
            for r in rooms
        )
        return (
            f"profiled_vram_gib({demand.vram_gib:g}) is more than any GPU here may hold "
            f"for one case ({limits})"
        )
    return None


def take(room: Room, demand: Demand) -> Room:
    return replace(
        room,
        reserved_gib=room.reserved_gib + demand.vram_gib,
        holders=room.holders + 1,
        whole=demand.whole_gpu,
    )


def give_back(room: Room, demand: Demand) -> Room:
    return replace(
        room,
        reserved_gib=max(0.0, room.reserved_gib - demand.vram_gib),
        holders=room.holders - 1,
        whole=room.whole and not demand.whole_gpu,
    )


def longest_first(demands: Iterable[Demand]) -> list[Demand]:
    return sorted(demands, key=lambda d: -d.timeout_s)


@dataclass(frozen=True)
class Step:
    order: int  # 1 = starts first
    key: str
    slot: int  # 1-based CPU slot
    gpu: int | None  # None: CPU only
    vram_gib: float
    start_s: float  # simulated, with each case lasting its timeout
    end_s: float


@dataclass
class Plan:
    slots: int
    steps: list[Step] = field(default_factory=list)
    #: (case key, why it is not run): over budget, or no GPU.
    refused: list[tuple[str, str]] = field(default_factory=list)
    #: (case key, why it could not start): memory other processes hold now would have to go.
    blocked: list[tuple[str, str]] = field(default_factory=list)

    @property
    def makespan_s(self) -> float:
        return max((s.end_s for s in self.steps), default=0.0)


def plan(demands: Sequence[Demand], rooms: Sequence[Room], slots: int) -> Plan:
    """Which case starts when, on which slot and GPU; and which are refused, and why."""
    result = Plan(slots=max(1, slots))
    queue: deque[Demand] = deque()
    for demand in longest_first(demands):
        why = refusal(demand, rooms)
        if why:
            result.refused.append((demand.key, why))
        else:
            queue.append(demand)
    state = {r.index: r for r in rooms}
    free_slots = list(range(1, result.slots + 1))
    waiting: list[tuple[Demand, int]] = []
    running: list[tuple[float, int, Demand, int | None]] = []  # end, slot, demand, gpu
    now = 0.0
    while queue or waiting:
        while free_slots and queue:
            waiting.append((queue.popleft(), free_slots.pop(0)))
        for demand, slot in list(waiting):
            gpu = None
            if demand.needs_gpu:
                room = best_fit(demand, state.values())
                if room is None:
                    continue
                gpu, state[room.index] = room.index, take(room, demand)
            waiting.remove((demand, slot))
            end = now + demand.timeout_s
            result.steps.append(
                Step(len(result.steps) + 1, demand.key, slot, gpu, demand.vram_gib, now, end)
            )
            running.append((end, slot, demand, gpu))
        if not running:  # nothing will end and free memory: what waits cannot start
            for demand in [d for d, _ in waiting] + list(queue):
                result.blocked.append((demand.key, blocked_reason(demand, rooms)))
            break
        now = min(end for end, *_ in running)
        for entry in [r for r in running if r[0] <= now + EPS]:
            running.remove(entry)
            _, slot, demand, gpu = entry
            if gpu is not None:
                state[gpu] = give_back(state[gpu], demand)
            free_slots.append(slot)
        free_slots.sort()
    return result


def blocked_reason(demand: Demand, rooms: Sequence[Room]) -> str:
    seen = "; ".join(
        f"GPU {r.index}: {r.foreign_gib:.1f} GiB used by other processes, "
        f"{r.reserved_gib:.1f} GiB held by other runs"
        for r in rooms
    )
    return f"needs {demand.vram_gib:g} GiB, which fits no GPU until others free memory ({seen})"


def plan_lines(result: Plan) -> list[str]:
    """The plan as text: one line per case in start order, then the refused and blocked."""
    width = max((len(s.key) for s in result.steps), default=4)
    lines = [
        f"{'#':>3}  {'start s':>7}  {'slot':>4}  {'GPU':>3}  {'GiB':>5}  {'case':<{width}}"
        f"  {'timeout s':>9}"
    ]
    for s in result.steps:
        gpu = "-" if s.gpu is None else str(s.gpu)
        lines.append(
            f"{s.order:>3}  {s.start_s:>7.0f}  {s.slot:>4}  {gpu:>3}  {s.vram_gib:>5.1f}  "
            f"{s.key:<{width}}  {s.end_s - s.start_s:>9.0f}"
        )
    lines.append(
        f"{len(result.steps)} cases on {result.slots} CPU slots; "
        f"makespan at most {result.makespan_s:.0f} s if each case took its whole timeout"
    )
    lines += [f"not run: {key}: {why}" for key, why in result.refused]
    lines += [f"blocked: {key}: {why}" for key, why in result.blocked]
    return lines
