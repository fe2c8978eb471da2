"""``compile_graph``: one NPU partition -> one executable with a static memory plan.

What compiling does, in order:

1. Every node is checked (``support.check_node``) and given its kernel (``kernels.BUILDERS``);
   builders read attributes and ask for constants through the ``_Context``.
2. Constants are laid out in one *weights* block (packed, possibly float16).
3. Intermediate tensors get offsets inside one *activation* block from the shared liveness
   planner (``core.memory.plan_memory``), checked with ``check_plan``; elementwise ops may
   write over their dying input (in-place hints).
4. Both blocks are allocated from the device pool. If they do not fit, ``OutOfMemoryError``
   names the partition, what it needs and what the device has, and nothing stays allocated.

At run time the executable reads its inputs at their device offsets, writes its outputs to
freshly allocated device tensors (the caller releases them), and computes every node on views
of device memory, with numpy's OpenBLAS at one thread (the simulated chip takes no host cores
beyond the caller's, and leaves no BLAS workers spinning after it). Weights and the activation
block are freed when the executable is dropped.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.npu_stub.driver import NpuMemory, NpuTensor
from anychip.backends.npu_stub.kernels import BUILDERS, load_all
from anychip.backends.npu_stub.kernels.support import check_node
from anychip.core.memory import Step, align_up, check_plan, lifetimes, plan_memory
from anychip.core.plugin.backend import CompiledGraph
from anychip.errors import (
    AnychipError,
    DeviceError,
    KernelError,
    OutOfMemoryError,
    UnsupportedOpError,
)

if TYPE_CHECKING:
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = ["compile_graph", "NpuExecutable", "WeightRef"]

_ALIGN = 64
_INPLACE_OPS = {"Relu", "Clip", "Sigmoid", "HardSwish", "Add", "Mul", "Sum", "BatchNormalization"}


class WeightRef:
    """A constant placed in device memory; ``array`` is its device view once placed."""

    __slots__ = ("host", "array", "offset")

    def __init__(self, host: np.ndarray) -> None:
        self.host: np.ndarray | None = host
        self.array: np.ndarray | None = None
        self.offset = 0


class _Context:
    """What kernel builders see (see ``kernels/__init__.py``)."""

    def __init__(self, fp16: bool) -> None:
        self.fp16 = fp16
        self.weights: dict[tuple[int, Any], WeightRef] = {}
        self.claimed: set[int] = set()

    def const(self, v: Value) -> np.ndarray:
        self.claimed.add(id(v))
        return v.const

    def weight(
        self,
        v: Value,
        pack: Callable[[np.ndarray], np.ndarray] | None = None,
        dtype: Any = None,
        key: Any = None,
    ) -> WeightRef:
        """``v``'s constant in device memory, packed by ``pack`` (shared by equal ``key``s:
        by default the value, the pack function's code and the dtype)."""
        self.claimed.add(id(v))
        if key is None:
            key = (
                id(v),
                pack.__code__ if pack is not None else None,
                np.dtype(dtype or v.const.dtype),
            )
        ref = self.weights.get(key)
        if ref is None:
            host = v.const if pack is None else pack(v.const)
            ref = WeightRef(np.ascontiguousarray(host, dtype=dtype or host.dtype))
            self.weights[key] = ref
        return ref


class _Op:
    """One node: its kernel, input slots, output slot (``outs``: every output's, for a
    multi-output kernel such as Split, whose run returns one array per output)."""

    __slots__ = ("run", "ins", "out", "outs", "node")

    def __init__(self, run: Any, ins: list[int | None], outs: list[int], node: Node) -> None:
        self.run = run
        self.ins = ins
        self.out = outs[0]
        self.outs = outs
        self.node = node


class NpuExecutable:
    """A compiled partition bound to one NPU memory; ``run`` is what the session calls."""

    def __init__(self, memory: NpuMemory, graph: Graph, fp16: bool) -> None:
        load_all()
        self.memory = memory
        self.name = graph.name
        self._lock = threading.Lock()
        ctx = _Context(fp16)
        slot: dict[int, int] = {}
        shapes: list[tuple[int, ...]] = []
        dtypes: list[np.dtype] = []
        weight_slots: dict[int, WeightRef] = {}

        def new_slot(v: Value) -> int:
            slot[id(v)] = len(shapes)
            shapes.append(tuple(v.shape))
            dtypes.append(np.dtype(v.const.dtype if v.const is not None else v.dtype.numpy))
            return slot[id(v)]

        self._inputs = [new_slot(v) for v in graph.inputs]
        self._ops: list[_Op] = []
        for node in graph.nodes:
            why = check_node(node)
            if why is not None:
                raise UnsupportedOpError(
                    f"npu: cannot compile node {node.name!r} ({node.qualified_op}) of "
                    f"{graph.name!r}: {why}; leave it to another device"
                )
            ctx.claimed = set()
            run = BUILDERS[(node.domain, node.op_type)](node, ctx)
            claimed = set(ctx.claimed)  # by the builder (not the placements below: a value
            ins: list[int | None] = []  # may feed several inputs, as Slice's ends and axes)
            for v in node.inputs:
                if v is None or id(v) in claimed:
                    ins.append(None)
                    continue
                if id(v) not in slot:  # a constant the kernel reads as it is
                    weight_slots[new_slot(v)] = ctx.weight(v)
                ins.append(slot[id(v)])
            outs = [new_slot(v) for v in node.outputs if v is not None]
            self._ops.append(_Op(run, ins, outs, node))
        self._outputs = [slot[id(v)] for v in graph.outputs]
        self._shapes, self._dtypes = shapes, dtypes
        self.nodes = len(graph.nodes)
        self._plan_and_place(ctx, weight_slots)

    def _plan_and_place(self, ctx: _Context, weight_slots: dict[int, WeightRef]) -> None:
        fixed = set(self._inputs) | set(weight_slots)
        steps = [
            Step(tuple(i for i in op.ins if i is not None), tuple(op.outs)) for op in self._ops
        ]
        sizes = {
            i: int(np.prod(s, dtype=np.int64)) * self._dtypes[i].itemsize
            for i, s in enumerate(self._shapes)
        }
        inplace = {
            op.out: op.ins[0]
            for op in self._ops
            if op.node.op_type in _INPLACE_OPS
            and op.ins[0] is not None
            and op.ins[0] not in fixed
            and self._shapes[op.ins[0]] == self._shapes[op.out]
            and self._dtypes[op.ins[0]] == self._dtypes[op.out]
        }
        tensors = lifetimes(steps, sizes, inputs=fixed, outputs=self._outputs)
        plan = plan_memory(tensors, inplace=inplace, alignment=_ALIGN)
        check_plan(plan, tensors, inplace=inplace)
        self.plan = plan
        refs = list(ctx.weights.values())
        total = 0
        for ref in refs:
            ref.offset = total
            total += align_up(max(ref.host.nbytes, 1), _ALIGN)
        self.weights_bytes = total
        self.activation_bytes = plan.total_size
        pool = self.memory.pool
        blocks = self._alloc_blocks(total, plan)
        weights_block, act_block = blocks
        for ref in refs:
            host = ref.host
            ref.array = self.memory.view(weights_block.offset + ref.offset, host.shape, host.dtype)
            ref.array[...] = host
            ref.host = None  # the device copy is the only one the kernels read
        self._fixed: list[np.ndarray | None] = [None] * len(self._shapes)
        for i, off in plan.offsets.items():
            self._fixed[i] = self.memory.view(
                act_block.offset + off, self._shapes[i], self._dtypes[i]
            )
        self._weight_slots = weight_slots
        self._finalizer = weakref.finalize(self, _free_blocks, pool, blocks)

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
        mem = self.memory
        if len(inputs) != len(self._inputs):
            raise DeviceError(
                f"npu: {self.name!r} takes {len(self._inputs)} inputs, got {len(inputs)}"
            )
        with self._lock:
            views = list(self._fixed)
            for i, ref in self._weight_slots.items():
                views[i] = ref.array
            for i, t in zip(self._inputs, inputs):
                arr = mem.tensor_view(t)
                if arr.shape != self._shapes[i] or arr.dtype != self._dtypes[i]:
                    raise DeviceError(
                        f"npu: {self.name!r} was compiled for "
                        f"{self._dtypes[i]}{list(self._shapes[i])}, "
                        f"got {arr.dtype}{list(arr.shape)}"
                    )
                views[i] = arr
            outs: list[NpuTensor] = []
            try:
                for i in self._outputs:
                    outs.append(mem.alloc_tensor(self._shapes[i], self._dtypes[i]))
                    views[i] = mem.tensor_view(outs[-1])
                for op in self._ops:
                    self._step(op, views)
            except BaseException:
                for t in outs:
                    mem.free(t)
                raise
            return outs

    @staticmethod
    def _step(op: _Op, views: list) -> None:
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
        return {
            "weights_bytes": self.weights_bytes,
            "activation_bytes": self.activation_bytes,
            "activation_lower_bound": self.plan.lower_bound,
            "plan_strategy": self.plan.strategy,
        }


def _free_blocks(pool: Any, blocks: list) -> None:
    for b in blocks:
        if b.live:
            pool.free(b)


def compile_graph(memory: NpuMemory, graph: Graph, *, precision: str) -> CompiledGraph:
    """Compile ``graph`` for the NPU whose memory is ``memory``."""
    exe = NpuExecutable(memory, graph, precision == "fp16")
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
    # The simulated chip computes on one host thread: numpy's OpenBLAS workers, at two threads,
    # spun about 0.1 s after each run on the cores the host device needed next (the CPU
    # alone's trial of GPT-like read 14.4 ms right after an NPU run against 3.4 at one thread;
    # the NPU's own run 26 ms against 4.2 on the loaded machine). A real NPU leaves no host
    # thread running.
    from anychip.core.run.blas import single_blas_thread

    return CompiledGraph(single_blas_thread(exe.run), info=info)
