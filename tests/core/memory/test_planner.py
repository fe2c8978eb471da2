"""The liveness planner, ``check_plan``, ``lifetimes`` and the plan cache."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anychip.core.memory import (
    STRATEGIES,
    MemoryPlan,
    MemoryPlanError,
    PlanCache,
    Step,
    TensorLifetime,
    align_up,
    check_plan,
    lifetimes,
    lower_bound,
    plan_memory,
    shape_signature,
)
from tests.core.memory.nets import NETS

T = TensorLifetime


def brute_force_bound(ts: list[TensorLifetime], alignment: int = 64) -> int:
    """Most aligned bytes live at one step, by walking every step (no in-place)."""
    end = max((t.last_use_step for t in ts), default=-1)
    return max(
        (
            sum(
                align_up(t.size_bytes, alignment)
                for t in ts
                if t.first_use_step <= step <= t.last_use_step
            )
            for step in range(end + 1)
        ),
        default=0,
    )


# -- basics --------------------------------------------------------------------------------------
def test_chain_reuses_memory():
    ts = [T("a", 100, 0, 1), T("b", 100, 1, 2), T("c", 100, 2, 3), T("d", 10, 3, 3)]
    plan = plan_memory(ts, alignment=64)
    check_plan(plan, ts)
    assert plan.lower_bound == 256 and plan.total_size == 256
    assert plan.offsets["a"] == plan.offsets["c"] != plan.offsets["b"]
    assert plan.ratio == 1.0 and "MemoryPlan(4 tensors" in repr(plan)


def test_empty_and_zero_size():
    plan = plan_memory([])
    check_plan(plan, [])
    assert (plan.total_size, plan.lower_bound, plan.offsets, plan.ratio) == (0, 0, {}, 1.0)
    ts = [T("z", 0, 0, 5), T("a", 8, 0, 5)]
    plan = plan_memory(ts)
    check_plan(plan, ts)
    assert plan.total_size == 64


def test_tuples_and_numpy_integers_accepted():
    np = pytest.importorskip("numpy")
    ts = [("a", np.int64(100), 0, np.int32(2)), ("b", 50, 1, 1)]
    plan = plan_memory(ts, alignment=16)
    check_plan(plan, ts)
    assert plan.total_size == 112 + 64 and plan.alignment == 16


@pytest.mark.parametrize(
    "bad, message",
    [
        ([T("a", 1, 0, 1), T("a", 1, 0, 1)], "listed twice"),
        ([T("a", -1, 0, 1)], ">= 0"),
        ([T("a", 1, 3, 1)], "first_use_step <= last_use_step"),
        ([T("a", 1.5, 0, 1)], "integers"),
    ],
)
def test_bad_lifetimes_rejected(bad, message):
    with pytest.raises(MemoryPlanError, match=message):
        plan_memory(bad)


def test_bad_arguments_rejected():
    with pytest.raises(MemoryPlanError, match="power of two"):
        plan_memory([T("a", 1, 0, 0)], alignment=24)
    with pytest.raises(MemoryPlanError, match="unknown planning strategies"):
        plan_memory([T("a", 1, 0, 0)], strategies=["random"])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_alone(strategy):
    ts = [T(i, 64 * (1 + (i * 7) % 5), i % 6, i % 6 + (i % 3)) for i in range(30)]
    plan = plan_memory(ts, strategies=[strategy])
    check_plan(plan, ts)
    assert plan.strategy == strategy and plan.total_size >= plan.lower_bound


# -- check_plan can fail -------------------------------------------------------------------------
def good_plan() -> tuple[MemoryPlan, list[TensorLifetime]]:
    ts = [T("a", 100, 0, 2), T("b", 64, 1, 3), T("c", 64, 3, 4)]
    plan = plan_memory(ts)
    check_plan(plan, ts)
    return plan, ts


def replace(plan: MemoryPlan, **changes) -> MemoryPlan:
    fields = {k: getattr(plan, k) for k in MemoryPlan.__slots__}
    fields.update(changes)
    return MemoryPlan(**fields)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"offsets": {"a": 0, "b": 64, "c": 0}}, "live together and overlap"),
        ({"offsets": {"a": 0, "b": 130, "c": 0}}, "not a multiple of the alignment"),
        ({"offsets": {"a": 0, "b": 128, "c": 0}, "total_size": 150}, "exceeds the block"),
        ({"offsets": {"a": 0, "b": 128}}, "no offset for tensors"),
        ({"offsets": {"a": 0, "b": 128, "c": 0, "zz": 0}}, "unknown tensors"),
        ({"offsets": {"a": 0, "b": -64, "c": 0}}, "negative"),
    ],
)
def test_check_plan_catches(changes, message):
    plan, ts = good_plan()
    with pytest.raises(MemoryPlanError, match=message):
        check_plan(replace(plan, **changes), ts)


def test_check_plan_catches_bad_inplace_pairs():
    plan, ts = good_plan()
    # b lives past c's birth step? No: b dies at 3 where c is born, so sharing is fine...
    shared = replace(plan, offsets={"a": 0, "b": 128, "c": 128}, inplace={"c": "b"})
    check_plan(shared, ts)
    with pytest.raises(MemoryPlanError, match="was not hinted"):
        check_plan(shared, ts, inplace={})
    # ...but a does not die where b is born, and b is not at a's offset.
    bogus = replace(plan, offsets={"a": 0, "b": 0, "c": 128}, inplace={"b": "a"})
    with pytest.raises(MemoryPlanError, match="dies at step 2, not at step 1"):
        check_plan(bogus, ts)
    larger = [T("a", 64, 0, 1), T("b", 128, 1, 2)]
    bogus = MemoryPlan({"a": 0, "b": 0}, 128, 128, 64, {"b": "a"}, "x")
    with pytest.raises(MemoryPlanError, match="larger than the input"):
        check_plan(bogus, larger)
    twice = [T("a", 64, 0, 1), T("b", 64, 1, 2), T("c", 64, 1, 2)]
    bogus = MemoryPlan({"a": 0, "b": 0, "c": 0}, 64, 64, 64, {"b": "a", "c": "a"}, "x")
    with pytest.raises(MemoryPlanError, match="already serves another output"):
        check_plan(bogus, twice)


# -- in-place ------------------------------------------------------------------------------------
def test_inplace_chain_shares_one_offset():
    # x -> relu -> add -> relu, each elementwise and the input dying at once.
    ts = [T("x", 1000, 0, 1), T("r", 1000, 1, 2), T("s", 1000, 2, 3), T("y", 1000, 3, 4)]
    hints = {"r": "x", "s": "r", "y": "s"}
    plan = plan_memory(ts, inplace=hints)
    check_plan(plan, ts, inplace=hints)
    assert plan.inplace == hints
    assert len(set(plan.offsets.values())) == 1 and plan.total_size == 1024
    assert plan.lower_bound == 1024
    without = plan_memory(ts)
    check_plan(without, ts, inplace={})
    assert without.total_size == 2048 and without.lower_bound == 2048


def test_inplace_hints_not_honoured_when_unsafe():
    ts = [
        T("x", 1000, 0, 3),  # still read after step 1: cannot be overwritten there
        T("a", 1000, 1, 2),
        T("small", 64, 2, 3),
        T("big", 4000, 3, 4),  # larger than small
        T("b", 64, 3, 4),  # small serves b...
        T("c", 64, 3, 4),  # ...and so cannot serve c too
    ]
    hints = {"a": "x", "big": "small", "b": "small", "c": "small", "ghost": "x", "x": "x"}
    plan = plan_memory(ts, inplace=hints)
    check_plan(plan, ts, inplace=hints)
    assert plan.inplace == {"b": "small"}


def test_inplace_chain_through_one_step_tensor_is_cut():
    # m lives only at step 1, where it is born from a and read by y: a, m and y would all be
    # live at step 1 at one offset, so only one of the two hints can be honoured.
    ts = [T("a", 64, 0, 1), T("m", 64, 1, 1), T("y", 64, 1, 2)]
    hints = {"m": "a", "y": "m"}
    plan = plan_memory(ts, inplace=hints)
    check_plan(plan, ts, inplace=hints)
    assert len(plan.inplace) == 1


def test_lower_bound_function():
    ts = [T("a", 100, 0, 1), T("b", 100, 1, 2)]
    assert lower_bound(ts) == 256
    assert lower_bound(ts, inplace={"b": "a"}) == 128
    assert lower_bound(ts, alignment=4) == 200


# -- random interval sets ------------------------------------------------------------------------
@st.composite
def problems(draw):
    n = draw(st.integers(0, 25))
    ts = []
    for i in range(n):
        first = draw(st.integers(0, 15))
        length = draw(st.integers(0, 6))
        size = draw(st.one_of(st.integers(0, 300), st.integers(1, 1 << 16)))
        ts.append(T(i, size, first, first + length))
    hints = {}
    for t in ts:
        candidates = [u.id for u in ts if u.last_use_step == t.first_use_step and u is not t]
        if candidates and draw(st.booleans()):
            hints[t.id] = draw(st.sampled_from(candidates))
    alignment = draw(st.sampled_from([1, 16, 64]))
    return ts, hints, alignment


@settings(max_examples=150, deadline=None)
@given(problems())
def test_random_plans_are_valid(problem):
    ts, hints, alignment = problem
    plan = plan_memory(ts, inplace=hints, alignment=alignment)
    check_plan(plan, ts, inplace=hints)
    assert plan.lower_bound <= plan.total_size
    assert plan.total_size <= sum(align_up(t.size_bytes, alignment) for t in ts)
    assert lower_bound(ts, alignment=alignment) == brute_force_bound(ts, alignment)
    plain = plan_memory(ts, alignment=alignment)
    check_plan(plain, ts, inplace={})
    assert plain.lower_bound == brute_force_bound(ts, alignment)
    assert plan.total_size <= plain.total_size  # hints are only used when they help


def test_random_plans_stay_close_to_the_bound():
    """Seeded, larger random sets: the greedy plan's worst ratio stays modest."""
    import random

    rng = random.Random(1234)
    worst = 1.0
    for _ in range(60):
        ts = []
        for i in range(rng.randint(5, 60)):
            first = rng.randrange(40)
            size = rng.choice([rng.randint(1, 4096), rng.randint(1, 1 << 20)])
            ts.append(T(i, size, first, first + int(rng.expovariate(1 / 4))))
        plan = plan_memory(ts)
        check_plan(plan, ts)
        worst = max(worst, plan.ratio)
    assert worst < 1.3, worst


# -- CNN-like graphs -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(NETS))
@pytest.mark.parametrize("use_hints", [False, True], ids=["no_inplace", "inplace"])
def test_cnn_plans_within_15_percent_of_bound(name, use_hints):
    net, output = NETS[name]()
    ts, hints = net.problem(output)
    plan = plan_memory(ts, inplace=hints if use_hints else None)
    check_plan(plan, ts, inplace=hints)
    assert plan.ratio <= 1.15, f"{name}: {plan!r}"
    if use_hints:
        assert plan.inplace, "elementwise ops whose input dies should run in place"
        plain = plan_memory(ts)
        check_plan(plain, ts, inplace={})
        assert plan.total_size <= plain.total_size


# -- lifetimes -----------------------------------------------------------------------------------
def test_lifetimes_from_steps():
    steps = [
        Step(("x", "w"), ("a",)),
        (("a",), ("b", "unused")),
        Step(("a", "b"), ("c",)),
        Step(("c",), ("y",)),
    ]
    sizes = {"a": 10, "b": 20, "c": 30, "unused": 5, "y": 7}
    ts = lifetimes(steps, sizes, inputs={"x", "w"}, outputs={"y"})
    assert ts == [T("a", 10, 0, 2), T("b", 20, 1, 2), T("unused", 5, 1, 1), T("c", 30, 2, 3)]
    plan = plan_memory(ts)
    check_plan(plan, ts)


@pytest.mark.parametrize(
    "steps, kwargs, message",
    [
        ([Step(("a",), ("b",))], {}, "reads 'a' before any step writes it"),
        ([Step((), ("a",)), Step((), ("a",))], {}, "already written at step 0"),
        ([Step((), ("x",))], {"inputs": {"x"}}, "graph input or initializer"),
        ([Step((), ("a",))], {"outputs": {"y"}}, "never written"),
        ([Step((), ("nosize",))], {}, "has no size"),
    ],
)
def test_lifetimes_errors(steps, kwargs, message):
    with pytest.raises(MemoryPlanError, match=message):
        lifetimes(steps, {"a": 1, "b": 1}, **kwargs)


def test_output_that_is_an_input_is_fine():
    assert lifetimes([Step(("x",), ("a",))], {"a": 4}, inputs={"x"}, outputs={"x"}) == [
        T("a", 4, 0, 0)
    ]


# -- plan cache ----------------------------------------------------------------------------------
def test_shape_signature():
    np = pytest.importorskip("numpy")
    a = shape_signature({"x": np.zeros((2, 3), np.float32), "m": (4,)})
    b = shape_signature({"m": [4], "x": np.ones((2, 3), np.float32)})
    assert a == b and hash(a) == hash(b)
    assert a != shape_signature({"x": np.zeros((2, 3), np.float64), "m": (4,)})
    assert a != shape_signature({"x": np.zeros((3, 3), np.float32), "m": (4,)})


def test_plan_cache_hits_misses_replans_evictions():
    planned: list[int] = []

    def planner(batch):
        def make():
            planned.append(batch)
            ts = [T("a", 64 * batch, 0, 1), T("b", 64 * batch, 1, 2)]
            plan = plan_memory(ts)
            check_plan(plan, ts)
            return plan

        return make

    cache = PlanCache(maxsize=2)
    p1 = cache.get_or_plan((1,), planner(1))
    assert cache.get_or_plan((1,), planner(1)) is p1
    cache.get_or_plan((8,), planner(8))
    assert (cache.hits, cache.misses, cache.replans, cache.evictions) == (1, 2, 0, 0)
    cache.get_or_plan((1,), planner(1))  # hit: (1,) becomes the most recent
    cache.get_or_plan((4,), planner(4))  # evicts (8,), the least recently used
    assert (8,) not in cache and (1,) in cache and len(cache) == 2
    assert cache.evictions == 1
    p8 = cache.get_or_plan((8,), planner(8))  # planned before: a re-plan
    assert cache.replans == 1 and p8.total_size == 2 * 512
    assert planned == [1, 8, 4, 8]
    assert (cache.hits, cache.misses) == (2, 4)
    assert "replans=1" in repr(cache)
    cache.clear()
    assert len(cache) == 0 and cache.hits == cache.misses == cache.replans == 0
    with pytest.raises(ValueError):
        PlanCache(maxsize=0)


def test_public_api_documented():
    import anychip.core.memory as memory

    for name in memory.__all__:
        obj = getattr(memory, name)
        if callable(obj):
            assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"
