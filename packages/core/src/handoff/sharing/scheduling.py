"""Cases of a pytest run under two budgets: CPU slots and GPU memory (the pytest side of
`handoff.sharing.placement` and `handoff.sharing.vram_ledger`).

- CPU slots are pytest-xdist workers (`-n`): xdist runs one case at a time per worker, and its
  `--maxprocesses` caps only `-n auto`. In a qualification run (`--pyargs
  handoff.qualification`) more workers than fit are not started: the CPUs `cpus.cpu_slots()`
  finds (the affinity mask and the cgroup CPU quota) divided by the CPUs one case keeps busy
  (`Backend.cpus_per_case`: the mocker's 0.5, measured, lets -n 4 run on 2 CPUs). The
  controller cuts xdist's `popen` workers down at
  configure time, before xdist (trylast) starts them, and the report header says so. `-n auto`
  is cut the same way (xdist counts physical cores, blind to masks and quotas).
  HANDOFF_CPU_SLOTS=N allows N workers on purpose.
- Order: the cases of one pool of workers (`handoff.pool`, their `xdist_group`) run one after
  another, pools longest first by their longest case's `handoff_timeout` marker, then in the
  order of their first case (a stable sort otherwise; without pools each case is a pool of its
  own, so the cases start longest first). With pools xdist runs `--dist loadgroup`, so each
  pool's cases go to one xdist worker; without pools it hands each worker a few items at a
  time, and the start order is longest first up to those chunks.
- GPU memory: a case with `profiled_vram_gib` above 0 (or `whole_gpu`) takes a reservation from
  the machine-wide ledger before it starts, waiting until a GPU has room under
  `--max-vram-gib` (per GPU; default: the GPU's total) and under what NVML shows other processes
  use; its processes get `CUDA_VISIBLE_DEVICES` of that GPU (set in the worker's environment
  for the case, which every process of the deployment inherits). The reservation is a
  `vram_ledger.Hold`, and a pool whose workers start under it holds it too: it goes once the
  case has ended and the pool's workers are gone (a fresh deployment's at the case's teardown).
  So a pool reserves once, for the largest marker of its cases, when its first case starts; a
  later case of the pool takes no reservation and runs on the pool's GPU. The next pool of this
  process (of another key: one pool at a time, `handoff.pool.Pools`) reserves while the last
  one's workers still run, counting their reservation as free for itself alone: they are
  stopped before its own start. The wait is bounded by the sum of the
  run's GPU case timeouts (every case ahead run one after another): past that, the case
  errors saying what holds the memory. Cases with 0 GiB (the mocker's) take no reservation and
  never read NVML: they run exactly as before.
- Refused: a case whose marker is over what any GPU may hold for it is skipped, the reason in
  its skip message; the run's summary lists them.
- `--handoff-dry-run` prints the plan (`placement.plan`: order, slot, GPU) for the chosen cases
  and the -n asked for, and starts nothing: no xdist worker, no case.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import replace

import pytest

from handoff.backend import TIMEOUT_MARKER
from handoff.errors import HandoffError
from handoff.machine.cpus import cpu_slots
from handoff.machine.polling import Deadline, Timeout
from handoff.sharing.nvml import GpuUnavailable, open_nvml
from handoff.sharing.placement import Demand, Room, plan, plan_lines, refusal
from handoff.sharing.vram_ledger import GpuLedger, Hold

REFUSED = "handoff: not run: "
#: The least a GPU case waits for room, however short the run's timeouts.
MIN_WAIT_S = 60.0


def add_options(group) -> None:
    group.addoption(
        "--max-vram-gib",
        type=float,
        help="GPU memory handoff's cases may hold at once on each GPU, in GiB, by their "
        "profiled_vram_gib markers (default: the GPU's total); a case over it is not run",
    )
    group.addoption(
        "--handoff-dry-run",
        action="store_true",
        help="print which case would run when, on which CPU slot and GPU; start nothing",
    )


def demand(item: pytest.Item) -> Demand:
    def value(name: str) -> float:
        marker = item.get_closest_marker(name)
        return float(marker.args[0]) if marker and marker.args else 0.0

    return Demand(
        key=item.callspec.id if hasattr(item, "callspec") else item.nodeid,
        vram_gib=value("profiled_vram_gib"),
        timeout_s=value(TIMEOUT_MARKER),
        whole_gpu=bool(value("whole_gpu")),
    )


def pool_of(item: pytest.Item) -> str:
    """The pool a case draws its workers from (its xdist group), or its own id when fresh."""
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker else item.nodeid


def is_pooled(item: pytest.Item) -> bool:
    return item.get_closest_marker("xdist_group") is not None


def is_case(item: pytest.Item) -> bool:
    return "handoff_case" in getattr(item, "fixturenames", ())


#: The workerinput key by which the controller tells an xdist worker how it distributes items
#: (a worker's own command line always says none).
DIST_KEY = "handoff_dist"


#: Set where `-n auto` was answered by `fitting_workers` (pytest_plugin).
AUTO = pytest.StashKey[bool]()


def fitting_workers(cpus_per_case: float, cases: int | None = None) -> tuple[int, str]:
    """How many cases fit on this machine's CPU slots at once, and why: a case that waits
    costs no CPU, so a backend whose cases mostly wait fits several to a CPU. Never more than
    the `cases` selected (when known): a worker with none to run only costs its start."""
    try:
        slots = cpu_slots()
    except HandoffError as exc:
        raise pytest.UsageError(str(exc)) from exc
    if slots.chosen:
        fit, why = slots.count, slots.why
    else:
        fit = max(1, math.floor(slots.count / cpus_per_case))
        why = f"{slots.why}, {cpus_per_case:g} CPUs a case"
    if cases is not None and cases < fit:
        return max(1, cases), f"{why}, {cases} cases selected"
    return fit, why


def stealing_lanes(config: pytest.Config) -> int:
    """How many xdist workers share the run's items under worksteal, as a worker sees it; 1
    for any other distribution, or none."""
    workerinput = getattr(config, "workerinput", {})
    if workerinput.get(DIST_KEY) != "worksteal":
        return 1
    return int(workerinput.get("workercount", 1))


def dealt(ordered: list[pytest.Item], lanes: int) -> list[pytest.Item]:
    """`ordered` (longest first) dealt to `lanes` in turn, back and forth, then the lanes one
    after another, those with fewer cases first: xdist's worksteal hands each worker a
    contiguous share of the items, the first workers the smaller shares, so each worker starts
    with one of the longest cases and the shares are about even; a worker that runs out takes
    half of the longest queue left."""
    shares: list[list[pytest.Item]] = [[] for _ in range(lanes)]
    for n, item in enumerate(ordered):
        turn, at = divmod(n, lanes)
        shares[at if turn % 2 == 0 else lanes - 1 - at].append(item)
    shares.sort(key=len)  # stable: the lanes of the longest cases stay first among equals
    return [item for share in shares for item in share]


class Scheduler:
    """Registered by the handoff pytest plugin at configure time, in the controller and in
    every xdist worker."""

    def __init__(
        self,
        config: pytest.Config,
        cpus_per_case: float = 1.0,
        recorded_s: Mapping[str, float] | None = None,
        cases: int | None = None,
    ) -> None:
        self.config = config
        self.cpus_per_case = cpus_per_case
        #: How many cases the command line selects, if known: no more workers than that.
        self.cases = cases
        #: Case key -> the seconds it took when recorded (`runs.durations`).
        self.recorded_s = dict(recorded_s or {})
        self.budget = config.getoption("max_vram_gib")
        self.dry_run = config.getoption("handoff_dry_run")
        self.notes: list[str] = []
        self.refused: list[tuple[str, str]] = []  # reported by the items' skips
        self.planned: list[str] = []
        self.ledger: GpuLedger | None = None
        self.wait_s = MIN_WAIT_S
        #: Each running case's hold and the environment it replaced.
        self.held: dict[str, tuple[Hold, dict[str, str | None]]] = {}
        #: The pool (its xdist group, or a fresh case's own id) of this process's last GPU
        #: case, and its hold.
        self.last: tuple[str, Hold] | None = None
        #: What each pool's cases need at most, of those not refused.
        self.pool_demands: dict[str, Demand] = {}
        self.slots = 1
        if self.budget is not None and self.budget <= 0:
            raise pytest.UsageError(f"--max-vram-gib must be above 0, not {self.budget:g}")
        if not hasattr(config, "workerinput"):  # the controller
            self._limit_workers()

    def _limit_workers(self) -> None:
        """Cut xdist's workers to the CPU slots in a qualification run (not, say, the
        project's own tests); no worker at all for a dry run."""
        option = self.config.option
        workers = list(getattr(option, "tx", None) or [])
        qualifying = "handoff.qualification" in self.config.args
        if not workers or not qualifying or any(spec != "popen" for spec in workers):
            self.slots = max(1, len(workers))
        else:
            fit, why = fitting_workers(self.cpus_per_case, self.cases)
            self.slots = min(len(workers), fit)
            if len(workers) > fit:
                option.tx = ["popen"] * fit
                self.notes.append(
                    f"handoff: {len(workers)} xdist workers asked for, {fit} started: {why}"
                )
            elif self.config.stash.get(AUTO, False):
                self.notes.append(f"handoff: -n auto starts {fit} xdist workers: {why}")
        if self.dry_run and workers:
            option.tx, option.dist = [], "no"

    def pytest_report_header(self) -> list[str]:
        return self.notes

    def rooms(self) -> tuple[list[Room], str]:
        """The visible GPUs now, or none and why."""
        if self.ledger is None:
            try:
                self.ledger = GpuLedger(open_nvml(), self.budget)
            except GpuUnavailable as exc:
                return [], str(exc)
        return self.ledger.rooms(), ""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]):
        cases = [i for i in items if is_case(i)]
        if not cases:
            return
        first: dict[str, int] = {}  # each pool's first place
        longest: dict[str, float] = {}  # each pool's longest case
        for n, item in enumerate(cases):
            first.setdefault(pool_of(item), n)
            longest[pool_of(item)] = max(longest.get(pool_of(item), 0.0), self.length(item))
        # A pool's cases run one after another, pools longest first.
        order = sorted(cases, key=lambda i: (-longest[pool_of(i)], first[pool_of(i)]))
        if (lanes := stealing_lanes(config)) > 1:
            order = dealt(order, lanes)
        ordered = iter(order)
        items[:] = [next(ordered) if is_case(i) else i for i in items]
        demands = {i: demand(i) for i in items if is_case(i)}
        on_gpu = [i for i, d in demands.items() if d.needs_gpu]
        rooms: list[Room] = []
        if on_gpu:
            rooms, why_none = self.rooms()
            self.wait_s = max(MIN_WAIT_S, sum(demands[i].timeout_s for i in on_gpu))
            for item in on_gpu:
                why = refusal(demands[item], rooms)
                if why:
                    reason = f"{why}{f' ({why_none})' if why_none else ''}"
                    budget = f" under --max-vram-gib {self.budget:g}" if self.budget else ""
                    item.add_marker(pytest.mark.skip(reason=f"{REFUSED}{reason}{budget}"))
                else:
                    self._add_to_pool(item, demands[item])
        if self.dry_run:
            self.planned = plan_lines(plan(list(demands.values()), rooms, self.slots))
            config.hook.pytest_deselected(items=list(items))
            items[:] = []

    def length(self, item: pytest.Item) -> float:
        """How long a case is expected to take: as recorded, else its timeout marker (a case
        never recorded counts as long)."""
        wanted = demand(item)
        return self.recorded_s.get(wanted.key, wanted.timeout_s)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and isinstance(report.longrepr, (tuple, list)):
            message = str(report.longrepr[2]).removeprefix("Skipped: ")
            if message.startswith(REFUSED):
                key = report.nodeid.rpartition("[")[2].rstrip("]")
                self.refused.append((key, message.removeprefix(REFUSED)))

    def _add_to_pool(self, item: pytest.Item, wanted: Demand) -> None:
        """Count `wanted` in what its pool reserves: the most any of its cases needs."""
        pool = pool_of(item)
        known = self.pool_demands.get(pool)
        if known is None:
            self.pool_demands[pool] = replace(wanted, key=pool) if is_pooled(item) else wanted
            return
        self.pool_demands[pool] = replace(
            known,
            vram_gib=max(known.vram_gib, wanted.vram_gib),
            timeout_s=max(known.timeout_s, wanted.timeout_s),
            whole_gpu=known.whole_gpu or wanted.whole_gpu,
        )

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        wanted = demand(item) if is_case(item) else None
        if wanted is None or not wanted.needs_gpu:
            return
        if self.ledger is None:
            _, why_none = self.rooms()
            if self.ledger is None:
                pytest.fail(f"{wanted.key} needs a GPU: {why_none}", pytrace=False)
        assert self.ledger is not None
        pool = pool_of(item)
        if self.last and self.last[0] == pool and not self.last[1].released:
            hold = self.last[1]  # the pool's workers run on it: no second reservation
        else:
            # A pool of another key that still holds its own is stopped before this one starts.
            last = self.last[1] if self.last and not self.last[1].released else None
            needed = self.pool_demands.get(pool, wanted)
            try:
                reservation = self.ledger.take(
                    needed, Deadline(self.wait_s), yielding=last.reservation if last else None
                )
            except Timeout as exc:
                pytest.fail(
                    f"no GPU had room for {wanted.key} in {self.wait_s:.0f} s: {exc}", False
                )
            hold = Hold(self.ledger, reservation)
            self.last = (pool, hold)
        hold.join(item.nodeid)
        saved = {name: os.environ.get(name) for name in hold.env}
        os.environ.update(hold.env)
        self.held[item.nodeid] = (hold, saved)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item):
        try:
            return (yield)
        finally:
            if item.nodeid in self.held:
                hold, saved = self.held.pop(item.nodeid)
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                hold.leave(item.nodeid)  # released here unless a pool still runs on it

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        if self.planned:
            tr.section("handoff plan (dry run: nothing started)")
            for line in self.planned:
                tr.write_line(line)
        if self.refused:
            tr.write_line(f"handoff: {len(self.refused)} cases not run, over the VRAM budget:")
            for key, why in self.refused:
                tr.write_line(f"    {key}: {why}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.dry_run and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            session.exitstatus = pytest.ExitCode.OK

    def pytest_unconfigure(self) -> None:
        if self.ledger is not None:
            self.ledger.nvml.close()
