"""``FuseAttentionPass``: scaled dot-product attention as exporters write it becomes one
``anychip::FusedAttention``::

    s = MatMul(Q, Kt); s = Div(s, c) | Mul(s, c); [s = Add(s, mask)]; p = Softmax(s, axis=-1)
    y = MatMul(p, V)

Fires where ``ir.passes.attention.match_attention`` matches (the cost model prices the same
chains as one kernel: ``core/plan/cost_patterns.py``). The shared pattern ``"attention"``
(``ir/passes/patterns``): a backend enables it when its kernel table runs
``anychip::FusedAttention`` (the CPU's ``kernels/op_fused_attention.py`` runs the same operations
in the same order, in one buffer; OpenCL's and the XPU's keep each block's scores on the device).
"""

from __future__ import annotations

from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.attention import match_attention
from anychip.ir.passes.patterns import pattern
from anychip.ir.passes.rewrite import attrs, fuse_each, fused_node, replace_chain

__all__ = ["FuseAttentionPass"]


@pattern("attention")
class FuseAttentionPass(Pass):
    """Fuse MatMul, scale, mask Add, Softmax and MatMul into ``anychip::FusedAttention``."""

    name = "fuse_attention"
    #: ``anychip.load(..., optimize=False)`` leaves it out.
    optimization = True

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        return fuse_each(graph, "MatMul", self._fuse, self.name)

    def _fuse(self, mm: Node, graph: Graph) -> int:
        m = match_attention(mm, graph)  # the conditions: ir/passes/attention.py
        if m is None:
            return 0
        out = m.nodes[-1]
        inputs = [mm.inputs[0], mm.inputs[1], out.inputs[1]] + ([m.mask] if m.mask else [])
        a = attrs(scale=m.scale, divide=int(m.divide))
        fused = fused_node(
            out, "FusedAttention", inputs, [out.outputs[0]], a, domain="anychip", version=1
        )
        replace_chain(graph, list(m.nodes), fused)
        return 1
