"""Liveness-based memory planning: one block, an offset per tensor, shared by every backend.

Input: the tensors a run creates, each with its size and the steps it lives through
(``TensorLifetime``; see ``liveness.lifetimes`` to compute them from an ordered list of steps),
and optional in-place hints ``{output: input}``. Output: a ``MemoryPlan`` with an offset per
tensor inside one block of ``total_size`` bytes, so that tensors whose lifetimes overlap never
overlap in memory. The executor then makes one allocation per run instead of one per tensor.

The algorithm is *greedy by size* (TFLite's "Efficient Memory Management for Deep Neural Net
Inference", onnxruntime's memory patterns, MindSpore SOMAS): tensors are placed largest first,
each at an offset that avoids every already placed tensor whose lifetime overlaps. Four
variants run and the smallest plan wins: the order is by size or "by breadth" (the tensors of
the step with the most live bytes first), and the offset is the lowest that fits (first fit)
or the one leaving the smallest gap (best fit). Each costs O(n^2) in the number of tensors.

``lower_bound`` is the largest number of bytes live at one step; no plan can be smaller, so
``total_size / lower_bound`` measures a plan's quality (CNNs: under 1.05 typically).

In-place: a hint ``{y: x}`` says an elementwise op may write ``y`` over ``x``. It is honoured
when ``x`` dies at the step ``y`` is born (``x.last_use_step == y.first_use_step``) and ``y`` is
not larger than ``x``; ``y`` then gets exactly ``x``'s offset. An input serves at most one
output, hints chain (``z`` over ``y`` over ``x``), and ``plan.inplace`` lists those honoured.

``check_plan(plan, tensors)`` verifies a plan independently of how it was made.

Example:
    >>> ts = [TensorLifetime("a", 100, 0, 1), TensorLifetime("b", 100, 1, 2),
    ...       TensorLifetime("c", 100, 2, 3)]
    >>> plan = plan_memory(ts, alignment=64)
    >>> plan.total_size, plan.lower_bound
    (256, 256)
    >>> plan.offsets["a"] == plan.offsets["c"]
    True
    >>> check_plan(plan, ts)
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from anychip.core.memory.intervals import TimeIndex, breadth_order, chain_overlap
from anychip.core.memory.pool import align_up
from anychip.errors import AnychipError

__all__ = [
    "TensorLifetime",
    "MemoryPlan",
    "MemoryPlanError",
    "plan_memory",
    "check_plan",
    "lower_bound",
    "STRATEGIES",
]

#: The placement variants ``plan_memory`` tries: (order, fit).
STRATEGIES: tuple[str, ...] = (
    "size/first_fit",
    "size/best_fit",
    "breadth/first_fit",
    "breadth/best_fit",
)


class MemoryPlanError(AnychipError):
    """A memory plan, or the lifetimes given to the planner, break an invariant."""


@dataclass(frozen=True, slots=True)
class TensorLifetime:
    """One tensor to plan: it occupies ``size_bytes`` from step ``first_use_step`` (the step that
    writes it) through ``last_use_step`` (the last step that reads it), both inclusive."""

    id: Hashable
    size_bytes: int
    first_use_step: int
    last_use_step: int


class MemoryPlan:
    """Where each tensor lives inside one block of ``total_size`` bytes.

    Invariants (``check_plan`` verifies them): every offset is a multiple of ``alignment`` and
    ``offset + size_bytes <= total_size``; two tensors whose lifetimes overlap do not overlap in
    memory, except a pair in ``inplace`` (output -> input), which share the same offset.
    ``lower_bound <= total_size`` (both counted in sizes rounded up to the alignment).
    """

    __slots__ = ("offsets", "total_size", "lower_bound", "alignment", "inplace", "strategy")

    def __init__(
        self,
        offsets: dict[Hashable, int],
        total_size: int,
        lower_bound: int,
        alignment: int,
        inplace: dict[Hashable, Hashable],
        strategy: str,
    ) -> None:
        self.offsets = offsets
        self.total_size = total_size
        self.lower_bound = lower_bound
        self.alignment = alignment
        self.inplace = inplace
        self.strategy = strategy

    @property
    def ratio(self) -> float:
        """``total_size / lower_bound`` (1.0 is optimal; 1.0 for an empty plan)."""
        return self.total_size / self.lower_bound if self.lower_bound else 1.0

    def __repr__(self) -> str:
        return (
            f"MemoryPlan({len(self.offsets)} tensors, total_size={self.total_size}, "
            f"lower_bound={self.lower_bound}, ratio={self.ratio:.3f}, "
            f"inplace={len(self.inplace)}, strategy={self.strategy!r})"
        )


LifetimeLike = TensorLifetime | Sequence[Any]


def _normalize(tensors: Iterable[LifetimeLike]) -> list[TensorLifetime]:
    """Tensors as ``TensorLifetime`` with plain ints (tuples and numpy integers accepted)."""
    out: list[TensorLifetime] = []
    seen: set[Hashable] = set()
    for item in tensors:
        t = item if isinstance(item, TensorLifetime) else TensorLifetime(*item)
        if t.id in seen:
            raise MemoryPlanError(f"tensor {t.id!r} is listed twice; give each tensor one lifetime")
        seen.add(t.id)
        try:
            size, first, last = (
                operator.index(v) for v in (t.size_bytes, t.first_use_step, t.last_use_step)
            )
        except TypeError:
            raise MemoryPlanError(
                f"tensor {t.id!r}: size_bytes, first_use_step and "
                f"last_use_step must be integers, got {t!r}"
            ) from None
        if size < 0:
            raise MemoryPlanError(f"tensor {t.id!r}: size_bytes must be >= 0, got {size}")
        if not 0 <= first <= last:
            raise MemoryPlanError(
                f"tensor {t.id!r}: needs 0 <= first_use_step <= last_use_step, got {first}..{last}"
            )
        if not all(type(v) is int for v in (t.size_bytes, t.first_use_step, t.last_use_step)):
            t = TensorLifetime(t.id, size, first, last)  # numpy integers: make them plain
        out.append(t)
    return out


def _overlap(a: TensorLifetime, b: TensorLifetime) -> bool:
    return a.first_use_step <= b.last_use_step and b.first_use_step <= a.last_use_step


class _Group:
    """Tensors that share one offset: a single tensor, or an in-place chain in time order."""

    __slots__ = ("members", "sizes", "size", "first", "last", "offset")

    def __init__(self, member: TensorLifetime, size: int) -> None:
        self.members = [member]
        self.sizes = [size]
        self.size = size
        self.first = member.first_use_step
        self.last = member.last_use_step
        self.offset = -1


def _build_groups(
    tensors: list[TensorLifetime], inplace: Mapping[Hashable, Hashable] | None, alignment: int
) -> tuple[list[_Group], dict[Hashable, Hashable]]:
    """Singleton groups, merged along the in-place hints that can be honoured."""
    by_id = {t.id: t for t in tensors}
    group_of = {t.id: _Group(t, align_up(t.size_bytes, alignment)) for t in tensors}
    honoured: dict[Hashable, Hashable] = {}
    pairs = list(inplace.items()) if inplace else []
    # In time order, so a chain x -> y -> z is built front to back.
    pairs.sort(key=lambda p: by_id[p[0]].first_use_step if p[0] in by_id else -1)
    for out_id, in_id in pairs:
        out, src = by_id.get(out_id), by_id.get(in_id)
        if out is None or src is None or out_id == in_id:
            continue  # a hint about a tensor the plan does not hold (graph input/output)
        if src.last_use_step != out.first_use_step or out.size_bytes > src.size_bytes:
            continue
        head, tail = group_of[in_id], group_of[out_id]
        if head is tail or head.members[-1] is not src or tail.members[0] is not out:
            continue  # src already serves another output, or out already reuses something
        # Only the hinted pair may share memory while both are live; every other pair of the
        # merged chain must be apart in time (a one-step middle tensor would break that).
        if chain_overlap(head, tail, src, out, _overlap):
            continue
        head.members.extend(tail.members)
        head.sizes.extend(tail.sizes)
        head.size = max(head.size, tail.size)
        head.first = min(head.first, tail.first)
        head.last = max(head.last, tail.last)
        for m in tail.members:
            group_of[m.id] = head
        honoured[out_id] = in_id
    unique: dict[int, _Group] = {}
    for t in tensors:
        unique.setdefault(id(group_of[t.id]), group_of[t.id])
    return list(unique.values()), honoured


def _bound_rectangles(group: _Group) -> Iterable[tuple[int, int, int]]:
    """(first, last, size) that count toward the live bytes; an in-place output adds nothing at
    the step it shares with its input (it lies inside the input's bytes)."""
    prev_last = -1
    for member, size in zip(group.members, group.sizes):
        first = member.first_use_step
        if first == prev_last:
            first += 1
        if first <= member.last_use_step:
            yield first, member.last_use_step, size
        prev_last = member.last_use_step


def _live_peak(groups: list[_Group]) -> int:
    events: list[tuple[int, int]] = []
    for g in groups:
        for first, last, size in _bound_rectangles(g):
            events.append((first, size))
            events.append((last + 1, -size))
    events.sort()
    live = peak = 0
    i = 0
    while i < len(events):
        step = events[i][0]
        while i < len(events) and events[i][0] == step:
            live += events[i][1]
            i += 1
        peak = max(peak, live)
    return peak


def lower_bound(
    tensors: Iterable[LifetimeLike],
    *,
    inplace: Mapping[Hashable, Hashable] | None = None,
    alignment: int = 64,
) -> int:
    """The most bytes live at any one step (sizes rounded up to ``alignment``)."""
    groups, _ = _build_groups(_normalize(tensors), inplace, alignment)
    return _live_peak(groups)


def _breadth_order(groups: list[_Group]) -> list[_Group]:
    """Groups of the step with the most live bytes first (largest first within a step)."""
    return breadth_order(groups, _bound_rectangles)


def _place(order: list[_Group], best_fit: bool) -> tuple[dict[int, int], int]:
    """Offsets (by group identity) for groups placed in ``order``; returns them and the total."""
    index = TimeIndex(max((g.last for g in order), default=0), len(order))
    offsets: dict[int, int] = {}
    total = 0
    for g in order:
        # Offsets o at which a member of g would overlap a placed member q in memory while
        # both are live: the open interval (q.offset - member size, q.offset + q.size).
        forbidden: list[tuple[int, int]] = []
        for p in index.overlapping(g.first, g.last):
            po = offsets[id(p)]
            for m, ms in zip(g.members, g.sizes):
                for q, qs in zip(p.members, p.sizes):
                    if ms and qs and _overlap(m, q):
                        forbidden.append((po - ms, po + qs))
        forbidden.sort()
        candidate, best, best_slack = 0, -1, -1
        for lo, hi in forbidden:
            if candidate <= lo:
                slack = lo - candidate
                if not best_fit:
                    best = candidate
                    break
                if best < 0 or slack < best_slack:
                    best, best_slack = candidate, slack
            candidate = max(candidate, hi)
        if best < 0:
            best = candidate
        offsets[id(g)] = best
        g.offset = best
        index.add(g)
        total = max(total, best + g.size)
    return offsets, total


def plan_memory(
    tensors: Iterable[LifetimeLike],
    *,
    inplace: Mapping[Hashable, Hashable] | None = None,
    alignment: int = 64,
    strategies: Sequence[str] = STRATEGIES,
) -> MemoryPlan:
    """Offsets for ``tensors`` inside one block, tensors live at the same time kept apart.

    Args:
        tensors: ``TensorLifetime`` records, or ``(id, size_bytes, first_use_step,
            last_use_step)`` tuples; ids are unique.
        inplace: Hints ``{output_id: input_id}`` (see the module docstring); hints about ids
            not in ``tensors`` or that cannot be honoured are ignored, and all are dropped in
            the rare case that a plan without them is smaller (``plan.inplace`` tells).
        alignment: Every offset is a multiple of it, and sizes are rounded up to it.
        strategies: Which of ``STRATEGIES`` to try; the smallest plan wins (ties: the first).

    Raises:
        MemoryPlanError: duplicate ids, negative sizes, a lifetime that ends before it starts,
            an unknown strategy.
    """
    if alignment <= 0 or alignment & (alignment - 1):
        raise MemoryPlanError(f"alignment must be a power of two, got {alignment}")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise MemoryPlanError(
            f"unknown planning strategies {unknown}; choose from {list(STRATEGIES)}"
        )
    ts = _normalize(tensors)
    best: tuple[int, int, str, list[_Group], dict[int, int], dict[Hashable, Hashable]] | None
    best = None
    # Honouring hints almost always saves memory, but it ties tensors together, which can
    # pack worse; plan without them too and keep the smaller block (ties: with hints).
    # A plan at the lower bound of the first grouping tried (its bound is the smallest: hints
    # only ever share bytes) cannot be beaten: the remaining variants are skipped.
    for hints in (inplace, None) if inplace else (None,):
        groups, honoured = _build_groups(ts, hints, alignment)
        if hints is not None and not honoured:
            continue
        bound = _live_peak(groups)
        for name, order, best_fit in _variants(groups, strategies):
            offsets, total = _place(order, best_fit)
            if best is None or total < best[0]:
                best = (total, bound, name, groups, offsets, honoured)
            if total == bound and best[3] is groups and hints is inplace:
                break
        if best is not None and best[0] == best[1] and hints is inplace:
            break
    assert best is not None
    total, bound, name, groups, group_offsets, honoured = best
    offsets = {m.id: group_offsets[id(g)] for g in groups for m in g.members}
    return MemoryPlan(offsets, total, bound, alignment, honoured, name)


def _variants(
    groups: list[_Group], strategies: Sequence[str]
) -> Iterable[tuple[str, list[_Group], bool]]:
    """(strategy name, placement order, best fit?) for each requested strategy."""
    by_size = sorted(groups, key=lambda g: (-g.size, g.first, -(g.last - g.first)))
    by_breadth: list[_Group] | None = None
    for name in strategies:
        order_name, fit = name.split("/")
        if order_name == "size":
            order = by_size
        else:
            by_breadth = by_breadth if by_breadth is not None else _breadth_order(groups)
            order = by_breadth
        yield name, order, fit == "best_fit"


def check_plan(
    plan: MemoryPlan,
    tensors: Iterable[LifetimeLike],
    *,
    inplace: Mapping[Hashable, Hashable] | None = None,
) -> None:
    """Verify ``plan`` for ``tensors``, whoever made it.

    Checks: every tensor has an offset and no other id does; offsets are aligned and every
    tensor lies inside ``[0, total_size)``; tensors whose lifetimes overlap do not overlap in
    memory, except the pairs in ``plan.inplace``, which must be valid in-place pairs (the input
    dies at the step the output is born, the output is not larger, both at one offset, each
    input used once) and, when ``inplace`` is given, among those hints.

    Raises:
        MemoryPlanError: listing what is wrong (the first 10 problems).
    """
    ts = _normalize(tensors)
    by_id = {t.id: t for t in ts}
    problems = _placement_problems(plan, ts, by_id)
    problems += _inplace_problems(plan, by_id, inplace)
    problems += _overlap_problems(plan, ts)
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise MemoryPlanError("invalid memory plan: " + "; ".join(problems[:10]) + more)


def _placement_problems(
    plan: MemoryPlan, ts: list[TensorLifetime], by_id: dict[Hashable, TensorLifetime]
) -> list[str]:
    """Every tensor has an aligned offset inside the block, and no unknown id has one."""
    problems: list[str] = []
    missing = [t.id for t in ts if t.id not in plan.offsets]
    if missing:
        problems.append(f"no offset for tensors {missing[:10]}")
    extra = [k for k in plan.offsets if k not in by_id]
    if extra:
        problems.append(f"offsets for unknown tensors {extra[:10]}")
    for t in ts:
        offset = plan.offsets.get(t.id)
        if offset is None:
            continue
        if offset < 0 or offset % plan.alignment:
            problems.append(
                f"tensor {t.id!r}: offset {offset} is negative or not a multiple "
                f"of the alignment {plan.alignment}"
            )
        if offset + t.size_bytes > plan.total_size:
            problems.append(
                f"tensor {t.id!r}: [{offset}, {offset + t.size_bytes}) exceeds "
                f"the block of {plan.total_size} bytes"
            )
    return problems


def _inplace_problems(
    plan: MemoryPlan,
    by_id: dict[Hashable, TensorLifetime],
    inplace: Mapping[Hashable, Hashable] | None,
) -> list[str]:
    """The plan's in-place pairs are hinted, valid and at one offset."""
    problems: list[str] = []
    sources: set[Hashable] = set()
    for out_id, in_id in plan.inplace.items():
        out, src = by_id.get(out_id), by_id.get(in_id)
        where = f"in-place pair {out_id!r} over {in_id!r}"
        if out is None or src is None:
            problems.append(f"{where}: names a tensor not in the plan")
            continue
        if inplace is not None and inplace.get(out_id) != in_id:
            problems.append(f"{where}: was not hinted")
        if in_id in sources:
            problems.append(f"{where}: {in_id!r} already serves another output")
        sources.add(in_id)
        if src.last_use_step != out.first_use_step:
            problems.append(
                f"{where}: {in_id!r} dies at step {src.last_use_step}, not at "
                f"step {out.first_use_step} where {out_id!r} is born"
            )
        if out.size_bytes > src.size_bytes:
            problems.append(
                f"{where}: output of {out.size_bytes} bytes is larger than the "
                f"input's {src.size_bytes}"
            )
        if plan.offsets.get(out_id) != plan.offsets.get(in_id):
            problems.append(
                f"{where}: offsets differ ({plan.offsets.get(out_id)} vs {plan.offsets.get(in_id)})"
            )
    return problems


def _overlap_problems(plan: MemoryPlan, ts: list[TensorLifetime]) -> list[str]:
    """No two tensors live at once overlap in memory (in-place pairs excepted)."""
    problems: list[str] = []
    # Sweep over time: compare each tensor with those still live when it is born.
    active: list[TensorLifetime] = []
    for t in sorted(ts, key=lambda t: t.first_use_step):
        active = [a for a in active if a.last_use_step >= t.first_use_step]
        to = plan.offsets.get(t.id)
        if to is not None and t.size_bytes:
            for a in active:
                ao = plan.offsets.get(a.id)
                if ao is None or not a.size_bytes:
                    continue
                if ao < to + t.size_bytes and to < ao + a.size_bytes:
                    if plan.inplace.get(t.id) == a.id or plan.inplace.get(a.id) == t.id:
                        continue
                    problems.append(
                        f"tensors {a.id!r} (steps {a.first_use_step}..{a.last_use_step}, "
                        f"bytes {ao}..{ao + a.size_bytes}) and {t.id!r} (steps "
                        f"{t.first_use_step}..{t.last_use_step}, bytes {to}.."
                        f"{to + t.size_bytes}) are live together and overlap in memory"
                    )
        active.append(t)
    return problems
