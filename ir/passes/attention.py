"""The scaled dot-product attention chain as exporters write it, matched once for everyone who
needs it: the fusion pass that turns it into ``anychip::FusedAttention`` (the shared pattern
``"attention"``, ``ir/passes/patterns/fuse_attention.py``, which the CPU, the XPU and OpenCL
enable) and the cost model, which prices the chain as
the one kernel those passes make of it (``core/plan/cost_patterns.py``)::

    s = MatMul(Q, Kt); s = Div(s, c) | Mul(s, c); [s = Add(s, mask)]; p = Softmax(s, axis=-1)
    y = MatMul(p, V)

Matches when the scores are float32 or float64, ``c`` is a float constant of one element, the
Softmax (opset 13 or later, or earlier on a rank-2 input) normalizes the last axis, each
intermediate is read once, as the next node's first input, and is not a graph output, and the
mask has the scores' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes.rewrite import FLOATS, scalar_const, single_use
from anychip.ir.value import Value

__all__ = ["AttentionChain", "match_attention"]


@dataclass(frozen=True)
class AttentionChain:
    """A matched chain: its nodes in order, the scale and how it applies, the mask if any."""

    nodes: tuple[Node, ...]
    scale: float
    divide: bool
    mask: Value | None


def _reader(node: Node, graph: Graph, ops: tuple[str, ...]) -> Node | None:
    """The one reader of ``node``'s output in ``graph``, reading it as its first input, when it
    is one of ``ops`` (standard domain)."""
    v = node.outputs[0]
    if not single_use(v, graph):
        return None
    user, index = v.uses[0]
    ok = user.graph is graph and not user.domain and user.op_type in ops and index == 0
    return user if ok else None


def _last_axis_softmax(node: Node) -> bool:
    rank = len(node.inputs[0].shape or ())
    version = node.version or 13
    axis = node.attr("axis", -1 if version >= 13 else 1)
    if version < 13 and rank != 2:
        return False
    return rank > 0 and axis in (-1, rank - 1)


def match_attention(mm: Node, graph: Graph) -> AttentionChain | None:
    """The attention chain that starts at the MatMul ``mm`` of ``graph``, or None."""
    if mm.op_type != "MatMul" or mm.domain or mm.outputs[0].dtype not in FLOATS:
        return None
    scale = _reader(mm, graph, ("Div", "Mul"))
    c = None if scale is None else scalar_const(scale.inputs[1])
    if c is None:
        return None
    nodes, mask = [mm, scale], None
    nxt = _reader(scale, graph, ("Add", "Softmax"))
    if nxt is not None and nxt.op_type == "Add":
        mask = nxt.inputs[1]
        if mask is scale.outputs[0] or mask.dtype != mm.outputs[0].dtype:
            return None
        nodes.append(nxt)
        nxt = _reader(nxt, graph, ("Softmax",))
    if nxt is None or nxt.op_type != "Softmax" or not _last_axis_softmax(nxt):
        return None
    nodes.append(nxt)
    out = _reader(nxt, graph, ("MatMul",))
    if out is None:
        return None
    nodes.append(out)
    return AttentionChain(tuple(nodes), c, scale.op_type == "Div", mask)
