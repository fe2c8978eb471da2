"""Shapes a static-shape device needs, known once constants are folded.

onnx's inference at import sees a TorchScript export's ``Expand(x, Where(Equal(c, ones * -1),
ones, c))`` with the shape computed from constants through ops it does not propagate data
through (Where, Equal): the Expand's output stays unknown, though the model's inputs are static.
Constant folding then makes that shape an initializer, and a second inference on the partition
as placed knows it. A static-shape device compiles a partition with static inputs at load
(``core/compile/pipeline``) and reads every value's shape: ``complete_shapes`` gives it those
inference can now compute. A shape inference still cannot tell (a chain through an op it does
not propagate, or one that depends on the inputs' values: an Expand to a shape fed as an
input) is traced by the partition's first run instead (``core/compile/specialize.py``); the
values of inputs that steer shapes (``steering_inputs``) are then part of the compile's key, so
an executable never serves values it was not traced with.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.ir.clone import copy_model
from anychip.ir.graph import Graph, Model

__all__ = ["all_static", "complete_shapes", "steering_inputs"]

#: Constants above this many elements go to inference as typed inputs without their data (it
#: needs their shapes; the small ones carry the values shapes are computed from).
_DATA_ELEMENTS = 1024


def all_static(graph: Graph) -> bool:
    """Whether every tensor value of ``graph`` (top level) has a static shape."""
    return all(v.is_static for v in graph.values() if v.is_tensor)


def complete_shapes(graph: Graph) -> bool:
    """Give each value of ``graph`` whose shape is not static the static shape onnx's inference
    (with data propagation) finds for the graph as it is now; True when all are then static.

    Only unknown dimensions are filled, never a known one changed; inference that fails leaves
    the graph as it was. The inference runs on a copy whose large constants have no data."""
    if all_static(graph):
        return True
    opsets: dict[str, int] = {}
    for node in graph.walk():
        if node.version is not None:
            opsets[node.domain] = max(opsets.get(node.domain, 0), int(node.version))
    skeleton = copy_model(Model(graph, opsets or None)).graph
    listed = {v.name for v in skeleton.inputs}
    for name, v in list(skeleton.initializers.items()):
        if v.const is not None and np.size(v.const) > _DATA_ELEMENTS:
            v.const = None
            del skeleton.initializers[name]
            if name not in listed:
                skeleton.inputs.append(v)
    import onnx

    from anychip.ir.onnx import export_model

    try:
        proto = export_model(Model(skeleton, opsets or None))
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # inference is best-effort: the shapes stay as they were
        return False
    known: dict[str, tuple[int, ...]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        shape = _static(vi)
        if shape is not None:
            known[vi.name] = shape
    for v in graph.values():
        if v.is_static or not v.is_tensor or v.name not in known:
            continue
        shape = known[v.name]
        if v.shape is None or (
            len(v.shape) == len(shape)
            and all(not isinstance(d, int) or d == s for d, s in zip(v.shape, shape, strict=True))
        ):
            v.shape = shape
    return all_static(graph)


def _static(vi: Any) -> Any:
    """The dims of ``vi`` when it is a tensor whose every dimension is a number, else None."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = vi.type.tensor_type.shape.dim
    if not all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
        return None
    return tuple(int(d.dim_value) for d in dims)


#: Inputs whose values decide an output's shape (or that a compiler reads as settings), by op.
_STEERING: dict[str, tuple[int, ...]] = {
    "Expand": (1,), "Reshape": (1,), "Tile": (1,), "ConstantOfShape": (0,),
    "Range": (0, 1, 2), "Slice": (1, 2, 3, 4), "Pad": (1, 3), "Resize": (1, 2, 3),
    "Upsample": (1,), "TopK": (1,), "OneHot": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
    "Split": (1,), "CumSum": (1,), "NonZero": (0,), "Compress": (1,), "CenterCropPad": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,), "Unique": (0,),
    "NonMaxSuppression": (0, 1, 2, 3, 4),
}  # fmt: skip
#: Ops whose output depends on their input's shape only, not its values.
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def steering_inputs(graph: Graph) -> list[int]:
    """Indices of ``graph``'s inputs whose *values* reach an input of ``_STEERING`` (other than
    through Shape or Size): a compile for one input signature fits those values only, so a
    run's key must hold them (an Expand to a shape fed as an input: a signature compiled for
    ``[3, 3]`` answered ``[1, 1]`` with a 3x3 result)."""
    producer = {id(o): n for n in graph.nodes for o in n.outputs if o is not None}
    index = {id(v): i for i, v in enumerate(graph.inputs)}
    found: set[int] = set()
    seen: set[int] = set()
    stack = [
        n.inputs[i]
        for n in graph.nodes
        if n.domain in ("", "ai.onnx")
        for i in _STEERING.get(n.op_type, ())
        if i < len(n.inputs) and n.inputs[i] is not None
    ]
    while stack:
        v = stack.pop()
        if v is None or id(v) in seen or v.const is not None:
            continue
        seen.add(id(v))
        if id(v) in index:
            found.add(index[id(v)])
        n = producer.get(id(v))
        if n is not None and n.op_type not in _SHAPE_ONLY:
            stack.extend(n.inputs)
    return sorted(found)
