"""``Program``: a compiled NPU partition in host memory, before it is placed on a device.

A program is what the compiler produces and what a serialized artifact holds: the op list
(each op's kernel, built from its node by ``kernels.BUILDERS``, and the slots it reads and
writes), every slot's shape and dtype, the constants packed for device memory (``WeightRef``:
an offset into one *weights* block, a shape, a dtype) and the static memory plan of the
intermediate slots inside one *activation* block. ``compiler.NpuExecutable`` places a program
on one NPU memory and runs it.

Builders see the node they build and a ``BuildContext``: in a compile, ``weight()`` packs and
lays out constants; in a load (``blob.py``), the context *replays* the weights the compile
gave that node, already packed in the artifact, so nothing is packed again. The context
therefore logs, per op, which weights its builder received (``Op.weights``) and which
constants it read on the host (``const_read``: stored as they are in an artifact).
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.memory import Step, align_up, check_plan, lifetimes
from anychip.errors import DeviceError

if TYPE_CHECKING:
    from anychip.core.memory.planner import MemoryPlan
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = ["WeightRef", "BuildContext", "Op", "Program", "ALIGN", "INPLACE_OPS"]

ALIGN = 64
INPLACE_OPS = {"Relu", "Clip", "Sigmoid", "HardSwish", "Add", "Mul", "Sum", "BatchNormalization"}


class WeightRef:
    """A constant for device memory: ``offset`` bytes into the weights block, ``shape`` and
    ``dtype``; ``host`` holds its packed bytes until it is placed, ``array`` its device view
    once placed."""

    __slots__ = ("host", "array", "offset", "shape", "dtype")

    def __init__(self, host: np.ndarray | None, shape: tuple = (), dtype: Any = None) -> None:
        self.host = host
        self.array: np.ndarray | None = None
        self.offset = 0
        self.shape = tuple(host.shape) if host is not None else tuple(shape)
        self.dtype = np.dtype(host.dtype if host is not None else dtype)

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize


class BuildContext:
    """What kernel builders see (see ``kernels/__init__.py``); ``replay`` set: a load."""

    def __init__(self, fp16: bool, replay: list[WeightRef] | None = None) -> None:
        self.fp16 = fp16
        self.refs: list[WeightRef] = [] if replay is None else replay
        self._index: dict[Any, int] = {}
        self._replay = replay is not None
        self.claimed: set[int] = set()
        self.const_read: set[int] = set()
        #: Indices into ``refs`` of the weights given out since ``expect`` (a compile logs
        #: them; a load hands out ``pending`` in that order).
        self.log: list[int] = []
        self.pending: list[int] = []

    def expect(self, indices: list[int] | None = None) -> None:
        """Start a node: in a load, the weights its builder gets, in order."""
        self.claimed = set()
        self.log = []
        self.pending = list(indices or [])

    def const(self, v: Value) -> np.ndarray:
        self.claimed.add(id(v))
        self.const_read.add(id(v))
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
        if self._replay:
            if not self.pending:
                raise DeviceError("npu: compiled program inconsistent (too few weights)")
            index = self.pending.pop(0)
            if not 0 <= index < len(self.refs):
                raise DeviceError(f"npu: compiled program inconsistent (no weight {index})")
            self.log.append(index)
            return self.refs[index]
        if key is None:
            key = (
                id(v),
                pack.__code__ if pack is not None else None,
                np.dtype(dtype or v.const.dtype),
            )
        index = self._index.get(key)
        if index is None:
            host = v.const if pack is None else pack(v.const)
            index = self._index[key] = len(self.refs)
            self.refs.append(WeightRef(np.require(host, dtype or host.dtype, "C")))  # rank 0 kept
        self.log.append(index)
        return self.refs[index]


class Op:
    """One node: its kernel, input slots (None: absent or taken by the builder), output
    slots (``outs``: every output's, for a multi-output kernel such as Split, whose run
    returns one array per output) and the weights its builder was given."""

    __slots__ = ("run", "ins", "out", "outs", "node", "weights")

    def __init__(
        self, run: Any, ins: list[int | None], outs: list[int], node: Node, weights: list[int]
    ) -> None:
        self.run = run
        self.ins = ins
        self.out = outs[0]
        self.outs = outs
        self.node = node
        self.weights = weights


class Program:
    """A compiled partition in host memory (see the module docstring).

    ``weight_slots`` maps the slots of constants a kernel reads as they are to their
    ``refs`` index; ``const_read`` holds the ids of the values builders read on the host.
    """

    def __init__(
        self,
        name: str,
        ops: list[Op],
        shapes: list[tuple[int, ...]],
        dtypes: list[np.dtype],
        inputs: list[int],
        outputs: list[int],
        refs: list[WeightRef],
        weight_slots: dict[int, int],
        const_read: set[int],
    ) -> None:
        self.name = name
        self.ops = ops
        self.shapes, self.dtypes = shapes, dtypes
        self.inputs, self.outputs = inputs, outputs
        self.refs = refs
        self.weight_slots = weight_slots
        self.const_read = const_read
        self.plan: MemoryPlan | None = None
        self.weights_bytes = 0

    def lifetimes(self) -> tuple[list[Any], dict[int, int]]:
        """The planner's view: each planned slot's lifetime, and the in-place hints."""
        fixed = set(self.inputs) | set(self.weight_slots)
        steps = [Step(tuple(i for i in op.ins if i is not None), tuple(op.outs)) for op in self.ops]
        sizes = {i: prod(s) * self.dtypes[i].itemsize for i, s in enumerate(self.shapes)}
        inplace = {
            op.out: op.ins[0]
            for op in self.ops
            if op.node.op_type in INPLACE_OPS
            and op.ins[0] is not None
            and op.ins[0] not in fixed
            and self.shapes[op.ins[0]] == self.shapes[op.out]
            and self.dtypes[op.ins[0]] == self.dtypes[op.out]
        }
        return lifetimes(steps, sizes, inputs=fixed, outputs=self.outputs), inplace

    def check(self, plan: MemoryPlan, lifetimes: tuple | None = None) -> None:
        """Take ``plan`` after verifying it for this op list (``check_plan`` raises);
        ``lifetimes``: ``self.lifetimes()`` when the caller has it."""
        tensors, inplace = lifetimes or self.lifetimes()
        check_plan(plan, tensors, inplace=inplace)
        self.plan = plan

    def layout_weights(self) -> None:
        """Give every weight its offset in the weights block, in order."""
        total = 0
        for ref in self.refs:
            ref.offset = total
            total += align_up(max(ref.nbytes, 1), ALIGN)
        self.weights_bytes = total
