"""In-place Concat: the inputs of a Concat are planned inside its output, so their producers
write their results straight into their slice and the Concat copies nothing.

onnxruntime's and OpenVINO's memory planners do the same ("in-place concat"). Here it is a
step before the liveness planner (``core/run/memory.py``): each qualifying input
(a *member*) is folded into its Concat's output (the *root*): its reads and writes count as the
root's, so the root lives from the first member's write to the last read of any of them, and
after planning the member's view starts at the root's offset plus the bytes of the inputs
before it. Concats nest: DenseNet's ``x1 = Concat(x0, f(x0))``, ``x2 = Concat(x1, f(x1))``, ...
put the whole dense block in one buffer, each layer's output written once where it belongs.

A slice of the output is one contiguous run of bytes only when every dimension before the axis
is 1 (batch 1 on the channel axis, the case here); other Concats are left as they are. A member
is an input that:

* has a planned shape and the output's dtype, and the plan places it (written through ``out=``
  by a single-output kernel, not a view of another tensor, not a graph input, constant or output);
* appears once among the Concat's inputs and in no other Concat's members.

What stays correct whatever a kernel does: a producer that declines its view (returns a fresh
array) or a Concat that declines its output gets a normal copy (the CPU's Concat copies only the
inputs that are not already where they belong); in-place hints that would write over a member
or write a member over another tensor are dropped, so nothing overwrites a member while the root
lives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from anychip.core.run.program import Program

__all__ = ["Placement", "concat_members", "resolve"]

ShapeMap = dict[int, tuple[tuple[int, ...], np.dtype]]

#: ``member slot -> (root slot, byte offset inside the root)``; the root may itself be a member.
Placement = dict[int, tuple[int, int]]


def concat_members(
    program: Program, shapes: ShapeMap, planned: set[int], root: dict[int, int]
) -> Placement:
    """The members of every qualifying Concat among ``planned`` slots (see the module
    docstring); ``root`` maps view slots to the tensor they view."""
    placed: Placement = {}

    def ok(s: int) -> bool:
        return s in planned and s not in root and s not in placed and s in writer

    writer = {ins.outs[0] for ins in program.instrs if ins.takes_out and len(ins.outs) == 1}
    known = dict(shapes)
    known.update(_static_externals(program))
    for ins in program.instrs:
        node = ins.node
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx") or not ins.takes_out:
            continue
        out = ins.outs[0]
        if out not in planned or out in root or out not in shapes:
            continue
        placed.update(_members_of(ins.ins, ins.attrs.get("axis"), out, known, ok))
    return placed


def _static_externals(program: Program) -> ShapeMap:
    """Shapes of the inputs, constants and captured values with static shapes (a Concat of
    one of them and a placed input copies it and needs its size to place the others)."""
    external = program.external_slots()
    known: ShapeMap = {}
    for v, s in program.slot_of.items():
        shape = v.shape
        if s in external and v.is_tensor and v.nbytes is not None and v.dtype.numpy is not None:
            assert shape is not None  # nbytes is known only for a static shape
            known[s] = (tuple(int(d) for d in shape), np.dtype(v.dtype.numpy))
    return known


def _members_of(
    inputs: Sequence[int], axis: int | None, out: int, shapes: ShapeMap, ok: Callable
) -> Placement:
    """One Concat's members and their offsets; none when the planned shapes do not add up to
    the output's (a member's view must never reach past its root)."""
    shape, dtype = shapes[out]
    a = 1 if axis is None else int(axis)
    a = a + len(shape) if a < 0 else a
    if not 0 <= a < len(shape) or prod(shape[:a]) != 1:
        return {}
    members: Placement = {}
    offset = 0
    along = 0
    for s in inputs:
        if s < 0 or s not in shapes:
            return {}
        sshape, sdtype = shapes[s]
        if sdtype != dtype or len(sshape) != len(shape):
            return {}
        if sshape[:a] != shape[:a] or sshape[a + 1 :] != shape[a + 1 :]:
            return {}
        if inputs.count(s) == 1 and ok(s):
            members[s] = (out, offset)
        offset += prod(sshape) * dtype.itemsize
        along += sshape[a]
    return members if along == shape[a] else {}


def resolve(placed: Placement, slot: int) -> tuple[int, int]:
    """The outermost root holding ``slot`` and ``slot``'s byte offset inside it (``slot``
    itself at 0 when it is no member)."""
    offset = 0
    seen = 0
    while slot in placed:
        slot, off = placed[slot]
        offset += off
        seen += 1
        if seen > len(placed):  # a cycle cannot arise from a topological order; never loop
            raise RuntimeError(f"concat placement cycles through slot {slot}")
    return slot, offset
