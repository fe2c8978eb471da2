"""What the array-API kernels cannot take beyond their table's ops, versions and dtypes.

``check(node)`` returns None to claim a node or a sentence saying why not, from the node's
attributes, inputs and outputs alone (placement asks before any tensor exists).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anychip.ir.node import Node

__all__ = ["check"]


def _rank(node: Node, i: int = 0) -> int | None:
    v = node.inputs[i] if i < len(node.inputs) else None
    shape = getattr(v, "shape", None) if v is not None else None
    return None if shape is None else len(shape)


def _used_outputs(node: Node) -> int:
    return sum(1 for v in node.outputs if v is not None and v.name)


def check(node: Node) -> str | None:
    """None when the family runs ``node``, else why not."""
    op = node.op_type
    for v in list(node.inputs) + list(node.outputs):
        if v is not None and not v.is_tensor:
            return f"{op} of a non-tensor value {v.name!r} (the array-API kernels take tensors)"
    rank = _rank(node)
    if op in ("Conv", "MaxPool", "AveragePool") and rank is not None and not 3 <= rank <= 5:
        return f"{op} of rank {rank} (the array-API kernels take 1-D to 3-D images)"
    if op == "BatchNormalization" and _used_outputs(node) > 1 and node.version < 14:
        return "BatchNormalization of opset < 14 with training outputs"
    if op == "LayerNormalization" and int(node.attr("stash_type", 1) or 1) != 1:
        return "LayerNormalization with a stash_type other than float32"
    if op == "Cast" and int(node.attr("saturate", 1) or 1) != 1:
        return "Cast with saturate=0 (float8 types)"
    return None
