"""The memory of a session's kernel-mode partitions: plans over a ``Program``, and arenas.

For each partition the session makes a ``PartitionMemory``. It plans the partition's
intermediate tensors with the shared liveness planner (``core.memory``):

* the *plan* covers every intermediate tensor whose shape is known; its ``total_size`` and
  ``lower_bound`` are the figures ``Session.memory()`` reports and budget-aware placement
  compares with the device's capacity;
* the *arena* plan covers the tensors the executor can really place: outputs of kernels that
  accept ``out=`` (the executor's out protocol). When there are some, each run takes one block
  from the device's pool (``registry.pools``, default ``CachingPool`` over host memory), hands
  those kernels views at their planned offsets, and gives the block back after the run. An
  arena under ``MIN_ARENA_BYTES`` is not used (numpy allocates those tensors faster).

Shapes: a partition whose intermediate shapes are all static is planned at compile time. One
with dynamic shapes is planned on the first run of each input-shape signature, from the shapes
that run produced, and the plan kept in a bounded ``PlanCache`` (hits, misses, re-plans).

Aliases: kernels registered ``alias=True`` return views of their first input (the CPU's
Reshape, Flatten, Split's pieces, ...). Their outputs are not separate tensors: their reads
count as reads of the viewed tensor, which lives until its last view is dead. Graph outputs
are copied out of the arena by the executor, so the viewed tensors also live until the end of
the run. In-place: kernels registered ``inplace=True`` (element-wise) may write their output
over their first input when it dies there (same shape and dtype). Both facts are read from the
kernel that runs the node, so a plugin's kernels declare their own.

In-place Concat (``core/run/concat_inplace.py``): at batch 1 the inputs of a Concat written
through ``out=`` are planned inside its output, so their producers write their slices and the
Concat copies nothing (``ProgramPlan.inside`` holds their offsets).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from math import prod
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from anychip.core.memory import (
    CachingPool,
    MemoryPlan,
    MemoryPool,
    NumpyAllocator,
    PlanCache,
    Step,
    check_plan,
    lifetimes,
    plan_memory,
)
from anychip.core.memory.recycle import MIN_BYTES, Outputs
from anychip.core.run.concat_inplace import concat_members, resolve
from anychip.core.run.program import Arena, Program
from anychip.errors import DeviceError
from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    from anychip.core.plugin.backend import Backend

__all__ = [
    "ALIAS_OPS",
    "MIN_ARENA_BYTES",
    "INPLACE_OPS",
    "ProgramPlan",
    "PartitionMemory",
    "plan_program",
    "default_pool",
    "static_shapes",
]

#: ONNX ops whose CPU kernels are registered ``alias=True`` (the planner reads the kernels).
ALIAS_OPS = frozenset(
    {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Split"}
)

#: ONNX ops whose CPU kernels are registered ``inplace=True`` (the planner reads the kernels).
INPLACE_OPS = frozenset(
    {
        "Abs", "Add", "BatchNormalization", "Ceil", "Clip", "Div", "Elu", "Erf", "Exp", "Floor",
        "HardSigmoid", "HardSwish", "LeakyRelu", "Log", "Max", "Mean", "Min", "Mul", "Neg",
        "Pow", "PRelu", "Reciprocal", "Relu", "Selu", "Sigmoid", "Softplus", "Sqrt", "Sub",
        "Sum", "Tanh",
    }
)  # fmt: skip

_ALIGNMENT = 64

ShapeMap = dict[int, tuple[tuple[int, ...], np.dtype]]


class ProgramPlan:
    """The plans of one partition for one set of shapes.

    Attributes:
        plan: Every intermediate tensor with a known shape (the reported figures).
        arena: The tensors written through ``out=`` (None when there are none).
        inside: ``slot -> arena offset`` of Concat inputs planned inside their Concat's output.
        shapes: ``slot -> (shape, dtype)`` the plans were made for.
    """

    __slots__ = ("plan", "arena", "shapes", "inside", "_layout", "_last")

    def __init__(
        self,
        plan: MemoryPlan,
        arena: MemoryPlan | None,
        shapes: ShapeMap,
        inside: dict[int, int] | None = None,
    ) -> None:
        self.plan = plan
        self.arena = arena
        self.shapes = shapes
        #: Arena offsets of the Concat inputs placed inside their Concat's output.
        self.inside = dict(inside or {})
        # The plans' tensor ids are this program's slots.
        offsets = dict(cast("dict[int, int]", arena.offsets)) if arena is not None else {}
        offsets.update(self.inside)
        self._layout = [(s, off, shapes[s][0], shapes[s][1]) for s, off in offsets.items()]
        #: The views made last, with the buffer they view: a pool handing back the same block
        #: run after run (a caching pool does) gets them again instead of one view per slot.
        self._last: tuple[Any, int, int, Arena] | None = None

    def views(self, buffer: Any, nslots: int) -> Arena:
        """The arena's views over ``buffer`` (a uint8 host array of ``arena.total_size``)."""
        if not isinstance(buffer, np.ndarray):
            raise DeviceError(
                f"the memory pool gave a {type(buffer).__name__} buffer; planned host memory "
                "needs numpy arrays (use core.memory.NumpyAllocator as the pool's allocator)"
            )
        base = buffer if buffer.base is None else buffer.base
        where = buffer.__array_interface__["data"][0]
        last = self._last
        if last is not None and last[0] is base and last[1] == where and last[2] == nslots:
            return last[3]
        views: list[Any] = [None] * nslots
        for s, off, shape, dtype in self._layout:
            nbytes = prod(shape) * dtype.itemsize
            views[s] = buffer[off : off + nbytes].view(dtype).reshape(shape)
        arena = Arena(views, base, self.arena.total_size if self.arena is not None else 0)
        self._last = (base, where, nslots, arena)
        return arena

    def device_views(self, block: Any, nslots: int) -> Arena:
        """The arena's views in a device's planned block (``Backend.device_arena``)."""
        views: list[Any] = [None] * nslots
        for s, off, shape, dtype in self._layout:
            views[s] = block.view(off, shape, dtype)
        return Arena(views, None, self.arena.total_size if self.arena is not None else 0)


def static_shapes(program: Program) -> tuple[ShapeMap, bool]:
    """``slot -> (shape, dtype)`` of the intermediate tensors with a static shape, and whether
    every intermediate tensor has one."""
    external = program.external_slots()
    shapes: ShapeMap = {}
    complete = True
    for v, s in program.slot_of.items():
        if s in external:
            continue
        if not v.is_tensor:
            continue  # sequences, optionals: never planned
        if v.dtype == DType.STRING:
            continue  # object arrays hold pointers: nothing to plan
        if v.nbytes is None or v.shape is None:
            # An output nobody reads (an old Dropout's mask) dies where it is born; its unknown
            # size does not make the partition dynamic (the plan leaves it out).
            if v.uses or s in program.output_slots:
                complete = False
            continue
        shapes[s] = (tuple(int(d) for d in v.shape), np.dtype(v.dtype.numpy))
    return shapes, complete


def _has_intermediates(program: Program, root: dict[int, int]) -> bool:
    """Whether ``program`` writes a tensor a plan would place: not an output, not a view of
    another (``root``), not a sequence, map or string tensor."""
    skip = program.external_slots() | set(program.output_slots) | set(root)
    return any(
        s not in skip and v.is_tensor and v.dtype != DType.STRING
        for v, s in program.slot_of.items()
    )


def _alias_roots(program: Program) -> dict[int, int]:
    """``slot -> the slot whose memory it views``, for outputs of ``alias=True`` kernels."""
    root: dict[int, int] = {}
    for ins in program.instrs:
        if ins.alias and ins.ins:
            src = ins.ins[0]
            if src >= 0:
                for o in ins.outs:
                    if o >= 0:
                        root[o] = root.get(src, src)
    return root


def _plan(
    program: Program,
    shapes: ShapeMap,
    planned: set[int],
    root: dict[int, int],
    steps: Sequence[Step],
) -> tuple[MemoryPlan, dict[int, int]]:
    """Plan the slots of ``planned`` (aliases resolved to the tensor they view, Concat inputs
    placed inside the Concat's output: ``core/run/concat_inplace.py``); returns the plan and
    the offsets of those Concat inputs."""
    placed = concat_members(program, shapes, planned, root)

    def home(s: Hashable) -> int:
        slot = cast(int, s)  # memory_steps' ids are slots (core.memory's Step takes any id)
        return resolve(placed, root.get(slot, slot))[0]

    final = Step(tuple(home(s) for s in program.output_slots), ())
    mapped = []
    written: set[int] = set()
    for st in list(steps) + [final]:
        reads = [r for r in (home(s) for s in st.reads) if r in planned]
        writes: list[int] = []
        for w in st.writes:
            if w not in planned or w in root:
                continue
            h = home(w)
            # a Concat's inputs and itself write one tensor: its first write starts it
            (reads if h in written else writes).append(h)
            written.add(h)
        mapped.append(Step(tuple(dict.fromkeys(reads)), tuple(dict.fromkeys(writes))))
    sizes: dict[Hashable, int] = {
        s: prod(shapes[s][0]) * shapes[s][1].itemsize for s in planned if s not in placed
    }
    tensors = lifetimes(mapped, sizes, outputs=set(program.output_slots) & planned)
    hints: dict[Hashable, Hashable] = {}
    for ins in program.instrs:
        if not ins.inplace or len(ins.outs) != 1 or not ins.ins:
            continue
        out, src = ins.outs[0], ins.ins[0]
        if (
            out in planned
            and src in planned
            and src not in root
            and out not in root
            and src not in placed
            and out not in placed
            and shapes[out] == shapes[src]
        ):
            hints[out] = src
    plan = plan_memory(tensors, inplace=hints, alignment=_ALIGNMENT)
    check_plan(plan, tensors, inplace=hints)
    inside = {}
    for s in placed:
        top, off = resolve(placed, s)
        inside[s] = plan.offsets[top] + off
    return plan, inside


def plan_program(program: Program, shapes: ShapeMap) -> ProgramPlan:
    """Plan ``program``'s intermediate tensors of known ``shapes`` (see the module docstring).

    Raises:
        MemoryPlanError: the planner made a plan its checker refuses (a bug, never silent).
    """
    root = _alias_roots(program)
    outputs = set(program.output_slots)
    steps = program.memory_steps()
    candidates = {s for s in shapes if s not in outputs and s not in root}
    plan, inside = _plan(program, shapes, candidates, root, steps)
    out_written = {
        ins.outs[0] for ins in program.instrs if ins.takes_out and ins.outs[0] in candidates
    }
    arena, arena_inside = None, {}
    if out_written == candidates and candidates:
        arena, arena_inside = plan, inside
    elif out_written:
        arena, arena_inside = _plan(program, shapes, out_written, root, steps)
    return ProgramPlan(plan, arena, shapes, arena_inside)


def default_pool(backend: Backend) -> MemoryPool:
    """The pool of a host-memory device when no plugin registered one: a ``CachingPool`` over
    numpy buffers, so each run's arena reuses the previous run's block."""
    return CachingPool(
        backend.name,
        capacity=getattr(backend.device, "memory_capacity", None),
        allocator=NumpyAllocator(),
        alignment=_ALIGNMENT,
    )


def _signature(inputs: Sequence[Any]) -> tuple:
    """The key of a run's plan: each input's shape and dtype (numpy's dtype objects hash and
    compare as they are; formatting them as strings cost more than the rest of a small run)."""
    return tuple(
        (t.shape, t.dtype)
        if type(t) is np.ndarray
        else (tuple(getattr(t, "shape", ())), str(getattr(t, "dtype", type(t).__name__)))
        for t in inputs
    )


#: Arenas smaller than this are not used: numpy allocates their few small tensors faster than
#: a run takes and gives back a pool block and its views (about 5 us a run, measured on the
#: scikit-learn models: PCA 18 -> 9 us, MLPRegressor 32 -> 23). They stay in the plan's figures.
MIN_ARENA_BYTES = 1 << 16


def _uses_arena(pp: ProgramPlan | None) -> bool:
    return pp is not None and pp.arena is not None and pp.arena.total_size >= MIN_ARENA_BYTES


def _offers(program: Program, shapes: ShapeMap, root: dict[int, int]) -> list[tuple]:
    """``(output index, slot, shape, dtype)`` of the outputs a kernel writes with a static
    shape of at least ``recycle.MIN_BYTES``: handed their last array again (``Outputs``)."""
    skip = program.external_slots() | set(root)
    found = []
    for i, s in enumerate(program.output_slots):
        if s in skip or s not in shapes or program.output_slots.index(s) != i:
            continue
        shape, dtype = shapes[s]
        if prod(shape) * dtype.itemsize >= MIN_BYTES:
            found.append((i, s, shape, dtype))
    return found


class PartitionMemory:
    """The plans and arena of one kernel-mode partition; ``runner`` is what the session calls.

    Args:
        program: The partition's compiled program.
        pool: The device's pool (host memory), or None when the device's tensors are not
            numpy arrays (no arena then; the plan is still made and reported).
        cache_size: Plans kept for dynamic shapes.
    """

    def __init__(self, program: Program, pool: MemoryPool | None, cache_size: int = 8) -> None:
        self.program = program
        self.pool = pool if program.backend.host_memory else None
        shapes, complete = static_shapes(program)
        root = _alias_roots(program)
        program.alias_slots = frozenset(root)
        # Nothing a plan could hold (every tensor written is an output or a view): no plan to
        # make per input-shape signature, and the runs go straight to the program.
        self.dynamic = not complete and _has_intermediates(program, root)
        self.cache: PlanCache[ProgramPlan] | None = PlanCache(cache_size) if self.dynamic else None
        self.current: ProgramPlan | None = None
        #: The largest plan and lower bound made so far (dynamic shapes: over the signatures).
        self.planned = 0
        self.lower_bound = 0
        #: The largest arena (the part of the plan kernels write through ``out=``).
        self.arena = 0
        if not self.dynamic:
            self._use(plan_program(program, shapes))
        #: The outputs' arrays, taken again once the caller drops them (``recycle.py``).
        self.outputs = Outputs()
        host = program.backend.host_memory
        self._offers = _offers(program, shapes, root) if host and not self.dynamic else []
        #: A per-run interceptor the backend installed (``Backend.runner``): ``around(inputs,
        #: usual)`` returns the outputs, by ``usual(inputs)`` or its own way (the CPU's replay of
        #: recorded calls). ``suspended`` > 0 bypasses it (the profiler times every node).
        self.around: Callable[[Sequence[Any], Callable[[Sequence[Any]], list[Any]]], list] | None
        self.around = None
        self.suspended = 0
        #: Planned device memory (own-memory devices, static shapes): the views, kept for
        #: every run, and the finalizer giving the block back (``close``).
        self.device_views: Arena | None = None
        self._device_block: Any = None
        if not host and not self.dynamic:
            self._plan_device()

    def _plan_device(self) -> None:
        """Take one block of the device for the arena plan, when the device offers it
        (``Backend.device_arena``); a device out of memory keeps allocating per tensor."""
        pp = self.current
        if pp is None or pp.arena is None or pp.arena.total_size <= 0:
            return
        try:
            block = self.program.backend.device_arena(pp.arena.total_size)
        except MemoryError:
            return
        if block is None:
            return
        self._device_block = weakref.finalize(self, block.close)
        self.device_views = pp.device_views(block, self.program.nslots)

    def close(self) -> None:
        """Give back the planned device block (the session's ``close()``); runs after it
        allocate per tensor."""
        self.device_views = None
        if self._device_block is not None:
            self._device_block()

    def intercept(self, around: Callable[..., list[Any]]) -> None:
        """Route each run through ``around(inputs, usual)`` (see ``around``)."""
        self.around = around

    def _use(self, pp: ProgramPlan) -> None:
        self.current = pp
        self.planned = max(self.planned, pp.plan.total_size)
        self.lower_bound = max(self.lower_bound, pp.plan.lower_bound)
        if pp.arena is not None and _uses_arena(pp):
            self.arena = max(self.arena, pp.arena.total_size)

    def arena_for(self, inputs: Sequence[Any]) -> tuple[Callable[[np.ndarray], Any] | None, int]:
        """The plan for these inputs' arena as ``(views of a buffer, its bytes)``; ``(None,
        0)`` where the runs use none (a recording's private arena, ``cpu/replay/record.py``)."""
        pp = self.cache.get(_signature(inputs)) if self.cache is not None else self.current
        if self.pool is None or pp is None or pp.arena is None or not _uses_arena(pp):
            return None, 0
        nslots = self.program.nslots
        return (lambda raw: pp.views(raw, nslots)), pp.arena.total_size

    @property
    def runner(self) -> Callable[[Sequence[Any]], list[Any]]:
        """The callable the session's run step uses."""
        if self.device_views is not None:
            return self.run
        if (
            not self.dynamic
            and not _uses_arena(self.current)
            and self.around is None
            and not self._offers
        ):
            return self.program.run  # nothing to do per run: no wrapper
        return self.run

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """Run the partition, planning first when these input shapes are new; replayed where
        it was recorded (``backends/cpu/replay/record.py``). The outputs are kept for the next run
        (``recycle.py``)."""
        around = self.around
        if around is not None and not self.suspended:
            outs = around(inputs, self._run)
        else:
            outs = self._run(inputs)
        self.outputs.keep(outs)
        return outs

    def _offered(self, arena: Arena | None) -> Arena | None:
        """``arena`` (or none) with the outputs' free arrays as their kernels' ``out`` views:
        a copy of its views list (the plan's own is reused by later runs and recordings)."""
        got = None
        for i, s, shape, dtype in self._offers:
            a = self.outputs.take(i, shape, dtype)
            if a is None:
                continue
            if got is None:
                got = (
                    Arena(list(arena.views), arena.base, arena.nbytes)
                    if arena is not None
                    else Arena([None] * self.program.nslots, None, 0)
                )
            got.views[s] = a
        return got if got is not None else arena

    def _run(self, inputs: Sequence[Any]) -> list[Any]:
        pp = self.current
        if self.cache is not None:  # dynamic shapes
            sig = _signature(inputs)
            pp = self.cache.get(sig)
            if pp is None:
                record: dict[int, tuple[tuple[int, ...], Any]] = {}
                outs = self.program.run(inputs, record=record)
                shapes = {s: (tuple(sh), np.dtype(dt)) for s, (sh, dt) in record.items()}
                if any(dt.hasobject for _, dt in shapes.values()):
                    shapes = {s: v for s, v in shapes.items() if not v[1].hasobject}
                pp = plan_program(self.program, shapes)
                self.cache.put(sig, pp)
                self._use(pp)
                return outs
            self.current = pp
        if self.device_views is not None:
            return self.program.run(inputs, arena=self.device_views)
        if self.pool is None or pp is None or pp.arena is None or not _uses_arena(pp):
            if self._offers:
                return self.program.run(inputs, arena=self._offered(None))
            return self.program.run(inputs)
        block = self.pool.alloc(pp.arena.total_size)
        try:
            raw = block.buffer[block.offset : block.offset + pp.arena.total_size]
            arena: Arena | None = pp.views(raw, self.program.nslots)
            if self._offers:
                arena = self._offered(arena)
            return self.program.run(inputs, arena=arena)
        finally:
            self.pool.free(block)

    def boundary_bytes(self) -> int:
        """Bytes of the partition's inputs, outputs and constants with static shapes."""
        g = self.program.graph
        seen = set()
        total = 0
        for v in list(g.inputs) + list(g.outputs) + list(g.initializers.values()):
            if v in seen:
                continue
            seen.add(v)
            total += v.nbytes or 0
        return total
