"""Shapes a static-shape device needs, known once constants are folded.

onnx's inference at import sees a TorchScript export's ``Expand(x, Where(Equal(c, ones * -1),
ones, c))`` with the shape computed from constants through ops it does not propagate data
through (Where, Equal): the Expand's output stays unknown, though the model's inputs are static.
Constant folding then makes that shape an initializer, and a second inference on the partition
as placed knows it. A static-shape device compiles a partition with static inputs at load
(``core/compile/pipeline``) and reads every value's shape: ``complete_shapes`` gives it those
inference can now compute. A shape that depends on the inputs' values (an Expand to a shape fed
as an input) stays unknown, and such a partition is refused by the device as before (a trace of
one run would fit the executable to that run's values only).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.ir.clone import copy_model
from anychip.ir.graph import Graph, Model

__all__ = ["all_static", "complete_shapes"]

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
