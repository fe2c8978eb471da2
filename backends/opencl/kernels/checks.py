"""What the OpenCL kernels cannot take beyond their table's ops, versions and dtypes.

``check(node)`` returns None to claim a node or a sentence saying why not, from the node's
attributes and inferred ranks alone (placement asks before any tensor exists).
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


def check(node: Node) -> str | None:
    """None when the OpenCL kernels run ``node``, else why not."""
    op = node.op_type
    for v in node.inputs:
        if v is not None and not v.is_tensor:
            return f"{op} of a non-tensor value {v.name!r} (the OpenCL kernels take tensors)"
    rank = _rank(node)
    if op == "Conv" and rank is not None and rank not in (3, 4):
        return f"Conv of rank {rank} (the OpenCL Conv takes 1-D and 2-D images)"
    if op in ("MaxPool", "AveragePool") and rank is not None and not 3 <= rank <= 5:
        return f"{op} of rank {rank} (the OpenCL pools take 1-D to 3-D windows)"
    if op == "FusedAttention" and any(
        _rank(node, i) is not None and _rank(node, i) < 2 for i in range(3)
    ):
        return "FusedAttention over a vector (the OpenCL kernel takes matrices)"
    if op == "LayerNormalization" and int(node.attr("stash_type", 1) or 1) != 1:
        return "LayerNormalization with a stash_type other than float32"
    return None
