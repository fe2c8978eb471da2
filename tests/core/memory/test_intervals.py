"""The planner's interval queries against the direct O(n^2) definitions they replace."""

from __future__ import annotations

import random

import pytest

from anychip.core.memory import planner
from anychip.core.memory.intervals import TimeIndex, breadth_order


def _lifetimes(rng: random.Random, n: int) -> tuple[list[tuple], dict]:
    ts, hints = [], {}
    for i in range(n):
        if i and rng.random() < 0.5:  # an in-place chain link: born where the last one dies
            first = ts[-1][3]
            hints[f"t{i}"] = f"t{i - 1}"
        else:
            first = rng.randint(0, 40)
        last = first + rng.choice([0, 0, 1, 2, 3, 5, 10, 30])
        ts.append((f"t{i}", rng.choice([0, 1, 64, 100, 1000, 4096]), first, last))
    return ts, hints


def _reference_breadth(groups: list) -> list:
    """The definition: every step's live bytes, steps by most bytes (then earliest), groups
    live at a step by size, each group at its first such step."""
    points = sorted({g.first for g in groups})
    totals, at = {}, {}
    for g in groups:
        for first, last, size in planner._bound_rectangles(g):
            for step in points:
                if first <= step <= last:
                    totals[step] = totals.get(step, 0) + size
                    at.setdefault(step, []).append(g)
    order, seen = [], set()
    for step in sorted(totals, key=lambda s: (-totals[s], s)):
        for g in sorted(at[step], key=lambda g: -g.size):
            if id(g) not in seen:
                seen.add(id(g))
                order.append(g)
    return order + [g for g in groups if id(g) not in seen]


@pytest.mark.parametrize("seed", range(40))
def test_breadth_order_is_the_definition(seed):
    rng = random.Random(seed)
    ts, hints = _lifetimes(rng, rng.randint(1, 60))
    for h in (hints, None):
        groups, _ = planner._build_groups(planner._normalize(ts), h, 64)
        assert breadth_order(groups, planner._bound_rectangles) == _reference_breadth(groups)


@pytest.mark.parametrize("seed", range(20))
def test_the_time_index_finds_exactly_the_overlapping_groups(seed):
    rng = random.Random(seed)
    ts, _ = _lifetimes(rng, 80)
    groups, _ = planner._build_groups(planner._normalize(ts), None, 64)
    index = TimeIndex(max(g.last for g in groups), len(groups))
    for g in groups[:40]:
        index.add(g)
    for q in groups:
        want = {id(g) for g in groups[:40] if g.first <= q.last and q.first <= g.last}
        assert {id(g) for g in index.overlapping(q.first, q.last)} == want


@pytest.mark.parametrize("seed", range(20))
def test_plans_stay_valid_and_at_least_as_small_as_the_bound(seed):
    rng = random.Random(100 + seed)
    ts, hints = _lifetimes(rng, rng.randint(1, 200))
    plan = planner.plan_memory(ts, inplace=hints)
    planner.check_plan(plan, ts, inplace=hints)
    assert plan.total_size >= plan.lower_bound
