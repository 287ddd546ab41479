"""Placement, pure: best fit, longest first, the budget never exceeded, oversize cases refused
with their reason, CPU-only cases on slots only, and the dry-run plan."""

import random
from dataclasses import replace

import pytest

from handoff.sharing.placement import (
    Demand,
    Room,
    best_fit,
    fits,
    longest_first,
    plan,
    plan_lines,
    refusal,
)


def gpus(*totals, budget=None, foreign=0.0):
    return [Room(i, t, budget or t, foreign_gib=foreign) for i, t in enumerate(totals)]


def test_best_fit_takes_the_gpu_left_with_least_room():
    rooms = [Room(0, 80, 80, reserved_gib=10), Room(1, 80, 80, reserved_gib=60), Room(2, 80, 80)]
    assert best_fit(Demand("a", 15), rooms).index == 1  # 5 GiB left there
    assert best_fit(Demand("b", 25), rooms).index == 0  # no longer fits GPU 1
    assert best_fit(Demand("c", 80), rooms).index == 2
    assert best_fit(Demand("d", 81), rooms) is None


def test_equal_room_goes_to_the_lowest_index():
    assert best_fit(Demand("a", 4), gpus(24, 24, 24)).index == 0


def test_a_gpu_has_room_under_both_the_budget_and_what_others_use():
    # Budget 40 of 80; another tenant holds 50: only 30 is physically left for handoff.
    room = Room(0, 80, 40, reserved_gib=0, foreign_gib=50)
    assert room.free_gib == 30
    assert fits(Demand("a", 30), room) and not fits(Demand("b", 31), room)
    # The budget binds when others use little.
    assert Room(0, 80, 40, reserved_gib=25, foreign_gib=1).free_gib == 15


def test_a_whole_gpu_case_owns_its_gpu_alone():
    rooms = [Room(0, 80, 80, reserved_gib=2, holders=1), Room(1, 80, 80)]
    whole = Demand("whole", 10, whole_gpu=True)
    assert best_fit(whole, rooms).index == 1
    owned = Room(1, 80, 80, reserved_gib=10, holders=1, whole=True)
    assert not fits(Demand("small", 1), owned)
    result = plan([Demand("whole", 10, 50, whole_gpu=True), Demand("small", 1, 10)], gpus(80), 2)
    whole_step, small_step = result.steps
    assert small_step.start_s >= whole_step.end_s  # it waited for the whole GPU to be given back


def test_cases_over_the_budget_are_refused_with_the_reason():
    rooms = gpus(141, 141, budget=40)
    why = refusal(Demand("big", 60), rooms)
    assert why == (
        "profiled_vram_gib(60) is more than any GPU here may hold for one case "
        "(GPU 0: 40.0 GiB (budget), GPU 1: 40.0 GiB (budget))"
    )
    assert refusal(Demand("fits", 40), rooms) is None
    assert "(total)" in refusal(Demand("huge", 200), gpus(141))
    assert refusal(Demand("gpu", 1), []) == ("it needs 1 GiB of GPU memory and no GPU is visible")
    assert refusal(Demand("mocker", 0), []) is None


def test_refusal_reads_budgets_not_what_others_use_now():
    # Another tenant holding most of the GPU makes a case wait, never vanish.
    assert refusal(Demand("a", 30), gpus(80, foreign=70)) is None


def test_longest_first_is_a_stable_sort_by_timeout():
    demands = [Demand("a", 0, 90), Demand("b", 0, 350), Demand("c", 0, 90), Demand("d", 0, 290)]
    assert [d.key for d in longest_first(demands)] == ["b", "d", "a", "c"]


def concurrent(steps, at):
    return [s for s in steps if s.start_s <= at < s.end_s]


@pytest.mark.parametrize("seed", range(25))
def test_the_plan_never_exceeds_the_budget_or_the_slots(seed):
    rng = random.Random(seed)
    budget, slots = rng.choice([10, 24, 40]), rng.randint(1, 6)
    rooms = gpus(*[rng.choice([24, 48, 80]) for _ in range(rng.randint(1, 3))], budget=budget)
    # Some GPUs have another tenant on them.
    rooms = [replace(r, foreign_gib=rng.choice([0.6, 0.6, 20])) for r in rooms]
    demands = [
        Demand(f"case-{n}", rng.choice([0, 0, 1.5, 4.8, 6.9, 12, 30, 60]), rng.randint(1, 9) * 10)
        for n in range(rng.randint(1, 30))
    ]
    result = plan(demands, rooms, slots)
    placed = {s.key for s in result.steps}
    refused = {k for k, _ in result.refused}
    blocked = {k for k, _ in result.blocked}
    assert placed | refused | blocked == {d.key for d in demands}
    assert not (placed & refused or placed & blocked or refused & blocked)
    for step in result.steps:
        running = concurrent(result.steps, step.start_s)
        assert len(running) <= slots
        assert len({s.slot for s in running}) == len(running)  # one case per slot at a time
        for room in rooms:
            here = sum(s.vram_gib for s in running if s.gpu == room.index)
            assert here <= room.capacity_gib + 1e-9
            assert here + room.foreign_gib <= room.total_gib + 1e-9
    for key, why in result.refused:
        assert next(d for d in demands if d.key == key).vram_gib > budget
        assert why.startswith("profiled_vram_gib(")
    assert [s.order for s in result.steps] == list(range(1, len(result.steps) + 1))
    assert [s.start_s for s in result.steps] == sorted(s.start_s for s in result.steps)


def test_cpu_only_cases_use_slots_only():
    result = plan([Demand(f"m{n}", 0, 90) for n in range(5)], [], 2)
    assert [(s.slot, s.gpu, s.start_s) for s in result.steps] == [
        (1, None, 0), (2, None, 0), (1, None, 90), (2, None, 90), (1, None, 180),
    ]  # fmt: skip
    assert result.refused == [] and result.makespan_s == 270


def test_a_case_waits_on_its_slot_until_memory_frees():
    # Budget 40 on one GPU: 30 + 20 cannot run together; the 20 waits on its slot and the
    # CPU-only case behind it takes the third slot at once.
    demands = [Demand("a", 30, 300), Demand("b", 20, 200), Demand("m", 0, 100)]
    result = plan(demands, gpus(141, budget=40), 3)
    steps = {s.key: s for s in result.steps}
    assert (steps["a"].start_s, steps["a"].slot, steps["a"].gpu) == (0, 1, 0)
    assert (steps["m"].start_s, steps["m"].slot, steps["m"].gpu) == (0, 3, None)
    assert (steps["b"].start_s, steps["b"].slot) == (300, 2)
    assert [s.key for s in result.steps] == ["a", "m", "b"]


def test_memory_others_hold_for_good_is_reported_as_blocked():
    result = plan([Demand("a", 30, 60)], gpus(40, foreign=20), 1)
    assert result.steps == []
    assert result.blocked == [
        (
            "a",
            "needs 30 GiB, which fits no GPU until others free memory "
            "(GPU 0: 20.0 GiB used by other processes, 0.0 GiB held by other runs)",
        )
    ]


def test_the_dry_run_plan_says_which_case_which_gpu_which_slot_in_which_order():
    demands = [
        Demand("aggregate/x", 4.8, 290),
        Demand("decode/y", 6.8, 350),
        Demand("kv_transfer/z", 6.9, 350),
        Demand("big/w", 60, 350),
    ]
    rooms = [Room(0, 139.8, 10, foreign_gib=0.6), Room(1, 139.8, 10, foreign_gib=0.6)]
    assert plan_lines(plan(demands, rooms, 2)) == [
        "  #  start s  slot  GPU    GiB  case           timeout s",
        "  1        0     1    0    6.8  decode/y             350",
        "  2        0     2    1    6.9  kv_transfer/z        350",
        "  3      350     1    0    4.8  aggregate/x          290",
        "3 cases on 2 CPU slots; makespan at most 640 s if each case took its whole timeout",
        "not run: big/w: profiled_vram_gib(60) is more than any GPU here may hold for one case "
        "(GPU 0: 10.0 GiB (budget), GPU 1: 10.0 GiB (budget))",
    ]
