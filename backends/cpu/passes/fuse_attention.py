"""``FuseAttentionPass``: scaled dot-product attention as exporters write it becomes one
``anychip::FusedAttention``::

    s = MatMul(Q, Kt); s = Div(s, c) | Mul(s, c); [s = Add(s, mask)]; p = Softmax(s, axis=-1)
    y = MatMul(p, V)

Fires when ``c`` is a float constant of one element, the Softmax (opset 13 or later, or
earlier on a rank-2 input) normalizes the last axis, ``p`` is read only as the second
MatMul's first input, and every intermediate has one reader and is not a graph output. The
kernel (``kernels/op_fused_attention.py``) runs the same operations in the same order, in one
buffer.
"""

from __future__ import annotations

from anychip.backends.cpu.passes._common import FLOATS, fused_node, record, scalar_const
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import attrs, single_use

__all__ = ["FuseAttentionPass"]


def _reader(node: Node, graph: Graph, ops: tuple[str, ...]) -> Node | None:
    v = node.outputs[0]
    if not single_use(v, graph):
        return None
    user = v.uses[0][0]
    ok = user.graph is graph and not user.domain and user.op_type in ops
    return user if ok else None


def _last_axis_softmax(node: Node) -> bool:
    rank = len(node.inputs[0].shape or ())
    axis = node.attr("axis", -1 if (node.version or 13) >= 13 else 1)
    if (node.version or 13) < 13 and rank != 2:
        return False
    return rank > 0 and axis in (-1, rank - 1)


class FuseAttentionPass(Pass):
    """Fuse MatMul, scale, mask Add, Softmax and MatMul into ``anychip::FusedAttention``."""

    name = "fuse_attention"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        fired = 0
        for mm in list(graph.nodes):
            if mm.graph is graph and mm.op_type == "MatMul" and not mm.domain:
                fired += self._fuse(mm, graph)
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)

    def _fuse(self, mm: Node, graph: Graph) -> int:
        if mm.outputs[0].dtype not in FLOATS:
            return 0
        scale = _reader(mm, graph, ("Div", "Mul"))
        if scale is None or scale.inputs[0] is not mm.outputs[0]:
            return 0
        c = scalar_const(scale.inputs[1])
        if c is None:
            return 0
        chain, mask = [mm, scale], None
        nxt = _reader(scale, graph, ("Add", "Softmax"))
        if nxt is not None and nxt.op_type == "Add":
            if nxt.inputs[0] is not scale.outputs[0] or nxt.inputs[1] is scale.outputs[0]:
                return 0
            mask = nxt.inputs[1]
            if mask.dtype != mm.outputs[0].dtype:
                return 0
            chain.append(nxt)
            nxt = _reader(nxt, graph, ("Softmax",))
        if nxt is None or nxt.op_type != "Softmax" or not _last_axis_softmax(nxt):
            return 0
        chain.append(nxt)
        out = _reader(nxt, graph, ("MatMul",))
        if out is None or out.inputs[0] is not nxt.outputs[0]:
            return 0
        chain.append(out)
        inputs = [mm.inputs[0], mm.inputs[1], out.inputs[1]] + ([mask] if mask else [])
        a = attrs(scale=float(c), divide=int(scale.op_type == "Div"))
        index = graph.nodes.index(out)
        fused = fused_node(
            out, "FusedAttention", inputs, [out.outputs[0]], a, domain="anychip", version=1
        )
        for n in reversed(chain):
            graph.remove(n)
        graph.insert(index - len(chain) + 1, fused)
        return 1
