"""``compile_graph``: one NPU partition -> one executable with a static memory plan.

What compiling does, in order:

1. Every node is checked (``support.check_node``) and given its kernel (``kernels.BUILDERS``);
   builders read attributes and ask for constants through the ``BuildContext``.
2. Constants are laid out in one *weights* block (packed, possibly float16).
3. Intermediate tensors get offsets inside one *activation* block from the shared liveness
   planner (``core.memory.plan_memory``), checked with ``check_plan``; elementwise ops may
   write over their dying input (in-place hints).
4. Both blocks are allocated from the device pool. If they do not fit, ``OutOfMemoryError``
   names the partition, what it needs and what the device has, and nothing stays allocated.

Steps 1-3 make a ``program.Program``; ``NpuExecutable`` does step 4. The executable's
``CompiledGraph.serialize()`` writes the program and the weights block as device memory holds
them (``blob.py``); ``load_graph`` reads those bytes back, rebuilds each kernel from its
stored node with the stored (already packed) weights, checks the stored plan and places it:
no passes, no packing, no planning. ``STATS`` counts compiles and loads in this process.

At run time the executable reads its inputs at their device offsets, writes its outputs to
freshly allocated device tensors (the caller releases them), and computes every node on views
of device memory, with numpy's OpenBLAS at one thread (the simulated chip takes no host cores
beyond the caller's, and leaves no BLAS workers spinning after it). Weights and the activation
block are freed when the executable is dropped.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.npu_stub.driver import NpuMemory, NpuTensor
from anychip.backends.npu_stub.kernels import BUILDERS, load_all
from anychip.backends.npu_stub.kernels.support import check_node
from anychip.backends.npu_stub.program import ALIGN, BuildContext, Op, Program
from anychip.core.memory import plan_memory
from anychip.core.plugin.backend import CompiledGraph
from anychip.errors import (
    AnychipError,
    DeviceError,
    KernelError,
    OutOfMemoryError,
    UnsupportedOpError,
)
from anychip.ir.passes.base import checkpoint

if TYPE_CHECKING:
    from anychip.ir.graph import Graph
    from anychip.ir.value import Value

__all__ = ["compile_graph", "load_graph", "build_program", "NpuExecutable", "STATS"]

log = logging.getLogger("anychip")

#: Process-wide counts of partitions compiled and loaded from bytes (tests and benchmarks
#: read them: a warm cache loads and never compiles).
STATS = {"compiles": 0, "loads": 0}
_STATS_LOCK = threading.Lock()


def _count(what: str) -> None:
    with _STATS_LOCK:
        STATS[what] += 1


def build_program(graph: Graph, fp16: bool) -> Program:
    """Steps 1-3 of the module docstring: the op list, the weights laid out, the plan."""
    load_all()
    ctx = BuildContext(fp16)
    slot: dict[int, int] = {}
    shapes: list[tuple[int, ...]] = []
    dtypes: list[np.dtype] = []
    weight_slots: dict[int, int] = {}

    def new_slot(v: Value) -> int:
        slot[id(v)] = len(shapes)
        shapes.append(tuple(v.shape))
        dtypes.append(np.dtype(v.const.dtype if v.const is not None else v.dtype.numpy))
        return slot[id(v)]

    inputs = [new_slot(v) for v in graph.inputs]
    ops: list[Op] = []
    for node in graph.nodes:
        checkpoint("the npu compiler")  # a spent compile budget stops here (budget.py)
        why = check_node(node)
        if why is not None:
            raise UnsupportedOpError(
                f"npu: cannot compile node {node.name!r} ({node.qualified_op}) of "
                f"{graph.name!r}: {why}; leave it to another device"
            )
        ctx.expect()
        run = BUILDERS[(node.domain, node.op_type)](node, ctx)
        claimed, given = set(ctx.claimed), list(ctx.log)  # by the builder (not the placements
        ins: list[int | None] = []  # below: a value may feed several inputs, as Slice's)
        for v in node.inputs:
            if v is None or id(v) in claimed:
                ins.append(None)
                continue
            if id(v) not in slot:  # a constant the kernel reads as it is
                new = new_slot(v)
                ctx.weight(v)
                weight_slots[new] = ctx.log[-1]
            ins.append(slot[id(v)])
        outs = [new_slot(v) for v in node.outputs if v is not None]
        ops.append(Op(run, ins, outs, node, given))
    outputs = [slot[id(v)] for v in graph.outputs]
    program = Program(
        graph.name, ops, shapes, dtypes, inputs, outputs, ctx.refs, weight_slots, ctx.const_read
    )
    tensors, inplace = found = program.lifetimes()
    program.check(plan_memory(tensors, inplace=inplace, alignment=ALIGN), found)
    program.layout_weights()
    return program


class NpuExecutable:
    """A program placed on one NPU memory; ``run`` is what the session calls.

    ``image`` (a load) is the weights block's bytes as the artifact holds them; without it
    the weights are copied in from their packed host arrays, which are then dropped (the
    device copy is the only one the kernels read).
    """

    def __init__(
        self, memory: NpuMemory, program: Program, image: memoryview | None = None
    ) -> None:
        self.memory = memory
        self.program = program
        self.name = program.name
        self._lock = threading.Lock()
        self.nodes = len(program.ops)
        plan = program.plan
        self.weights_bytes = program.weights_bytes
        self.activation_bytes = plan.total_size
        pool = self.memory.pool
        blocks = self._alloc_blocks(program.weights_bytes, plan)
        weights_block, act_block = blocks
        self._finalizer = weakref.finalize(self, _free_blocks, pool, blocks)
        base = weights_block.offset
        if image is not None:
            self.memory.data[base : base + len(image)] = np.frombuffer(image, np.uint8)
        for ref in program.refs:
            ref.array = self.memory.view(base + ref.offset, ref.shape, ref.dtype)
            if ref.host is not None:
                ref.array[...] = ref.host
                ref.host = None
        self._fixed: list[np.ndarray | None] = [None] * len(program.shapes)
        for i, off in plan.offsets.items():
            self._fixed[i] = self.memory.view(
                act_block.offset + off, program.shapes[i], program.dtypes[i]
            )
        for i, r in program.weight_slots.items():
            self._fixed[i] = program.refs[r].array
        self._weights_block = weights_block

    def weights_image(self) -> memoryview:
        """The weights block's bytes in device memory (what an artifact stores)."""
        base = self._weights_block.offset
        return memoryview(self.memory.data[base : base + self.weights_bytes])

    def _alloc_blocks(self, weights: int, plan: Any) -> list[Any]:
        """The weights' block and the activations' block, or an OutOfMemoryError that says
        what the partition needs and what the device has."""
        pool = self.memory.pool
        blocks = []
        try:
            for nbytes in (weights, plan.total_size):
                blocks.append(pool.alloc(nbytes))
        except OutOfMemoryError as e:
            for b in blocks:
                pool.free(b)
            need = weights + plan.total_size
            stats = pool.stats()
            raise OutOfMemoryError(
                f"npu: partition {self.name!r} does not fit in NPU memory: it needs {need} "
                f"bytes ({weights} of weights + {plan.total_size} of activations, planned; lower "
                f"bound {plan.lower_bound}), the device has {stats.capacity} bytes with "
                f"{stats.in_use} in use (largest free block {stats.largest_free}). Give the NPU "
                'more memory (device_options={"npu": {"memory": ...}} or ANYCHIP_NPU_MEMORY), '
                "or place part of the model on another device.",
                device="npu",
                need=need,
                capacity=stats.capacity or 0,
                in_use=stats.in_use,
            ) from e
        return blocks

    def run(self, inputs: Sequence[Any]) -> list[NpuTensor]:
        """Run on device tensors (graph input order); returns new device tensors."""
        mem, program = self.memory, self.program
        if len(inputs) != len(program.inputs):
            raise DeviceError(
                f"npu: {self.name!r} takes {len(program.inputs)} inputs, got {len(inputs)}"
            )
        with self._lock:
            views = list(self._fixed)
            for i, t in zip(program.inputs, inputs):
                arr = mem.tensor_view(t)
                if arr.shape != program.shapes[i] or arr.dtype != program.dtypes[i]:
                    raise DeviceError(
                        f"npu: {self.name!r} was compiled for "
                        f"{program.dtypes[i]}{list(program.shapes[i])}, "
                        f"got {arr.dtype}{list(arr.shape)}"
                    )
                views[i] = arr
            outs: list[NpuTensor] = []
            try:
                for i in program.outputs:
                    outs.append(mem.alloc_tensor(program.shapes[i], program.dtypes[i]))
                    views[i] = mem.tensor_view(outs[-1])
                for op in program.ops:
                    self._step(op, views)
            except BaseException:
                for t in outs:
                    mem.free(t)
                raise
            return outs

    @staticmethod
    def _step(op: Op, views: list) -> None:
        try:
            result = op.run([None if i is None else views[i] for i in op.ins])
            if len(op.outs) == 1:
                np.copyto(views[op.out], result)
            else:
                for i, r in zip(op.outs, result, strict=True):
                    np.copyto(views[i], r)
        except AnychipError:
            raise
        except Exception as e:
            raise KernelError(
                f"npu: node {op.node.name!r} ({op.node.qualified_op}) failed: "
                f"{type(e).__name__}: {e}"
            ) from e

    def info(self) -> dict[str, Any]:
        plan = self.program.plan
        return {
            "weights_bytes": self.weights_bytes,
            "activation_bytes": self.activation_bytes,
            "activation_lower_bound": plan.lower_bound,
            "plan_strategy": plan.strategy,
        }


def _free_blocks(pool: Any, blocks: list) -> None:
    for b in blocks:
        if b.live:
            pool.free(b)


def compile_graph(memory: NpuMemory, graph: Graph, *, precision: str) -> CompiledGraph:
    """Compile ``graph`` for the NPU whose memory is ``memory``."""
    t0 = time.perf_counter()
    exe = NpuExecutable(memory, build_program(graph, precision == "fp16"))
    fused = sum(1 for n in graph.nodes if n.op_type == "NpuConv" and n.attr("activation", ""))
    info = {
        "nodes_before_passes": graph.meta.get("nodes_before_passes", len(graph.nodes)),
        "nodes_after_passes": len(graph.nodes),
        "passes": list(graph.meta.get("passes", [])),
        "fused_ops": fused,
        **exe.info(),
        "precision": precision,
        "memory_capacity": memory.capacity,
    }
    _count("compiles")
    log.debug("npu: compiled %r (%d ops) in %.3f s", exe.name, exe.nodes, time.perf_counter() - t0)
    return _compiled(exe, info, precision)


def load_graph(memory: NpuMemory, data: bytes, *, precision: str) -> CompiledGraph:
    """The executable ``data`` (from ``CompiledGraph.serialize()``) holds, placed on the NPU
    whose memory is ``memory``, without compiling.

    Raises:
        DeviceError: ``data`` is not a valid program of this format and precision.
        OutOfMemoryError: it does not fit in free NPU memory.
    """
    from anychip.backends.npu_stub import blob

    t0 = time.perf_counter()
    program, image, info = blob.load(data, precision)
    exe = NpuExecutable(memory, program, image)
    info = {**info, **exe.info(), "memory_capacity": memory.capacity}
    _count("loads")
    log.debug(
        "npu: loaded %r (%d ops, %d bytes) in %.3f s",
        exe.name,
        exe.nodes,
        len(data),
        time.perf_counter() - t0,
    )
    return _compiled(exe, info, precision)


def _compiled(exe: NpuExecutable, info: dict[str, Any], precision: str) -> CompiledGraph:
    def serialize() -> bytes | None:
        from anychip.backends.npu_stub import blob

        try:
            return blob.dump(exe.program, exe.weights_image(), info, precision)
        except blob.Unserializable as e:
            log.info("npu: partition %r is not stored on disk: %s", exe.name, e)
            return None

    # The simulated chip computes on one host thread: numpy's OpenBLAS workers, at two threads,
    # spun about 0.1 s after each run on the cores the host device needed next (the CPU
    # alone's trial of GPT-like read 14.4 ms right after an NPU run against 3.4 at one thread;
    # the NPU's own run 26 ms against 4.2 on the loaded machine). A real NPU leaves no host
    # thread running.
    from anychip.core.run.blas import single_blas_thread

    return CompiledGraph(single_blas_thread(exe.run), info=info, serialize=serialize)
