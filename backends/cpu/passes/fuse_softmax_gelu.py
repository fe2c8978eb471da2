"""Two small recognizers that turn an exported formula back into its ONNX op.

``FuseSoftmaxPass``: the numerically stable softmax exporters write,
``e = Exp(Sub(x, ReduceMax(x))); y = Div(e, ReduceSum(e))`` over one axis with
``keepdims=1``, becomes ``Softmax(x, axis)`` (opset 13). Provably the same computation:
Softmax subtracts the same maximum, and ``max(x - max(x)) = 0`` exactly, so it exponentiates
and normalizes the same values. The form without the maximum (``Exp(x) / ReduceSum(Exp(x))``)
is left alone: it overflows to NaN from x = 89 where Softmax does not.

``FuseGeluPass``: the erf form ``Mul(Mul(x, Add(Erf(x / sqrt 2), 1)), 0.5)`` (divisor
``sqrt 2`` or factor ``1 / sqrt 2`` to 1e-4; the 0.5 on either side) becomes ``Gelu(x)``
(opset 20). The tanh form's ops are all element-wise: ``FuseElementwisePass`` makes one
kernel of it as written.
"""

from __future__ import annotations

import math

from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import (
    FLOATS,
    attrs,
    fuse_each,
    fused_node,
    kept_axes,
    producer,
    replace_chain,
    scalar_const,
    single_use,
)

__all__ = ["FuseSoftmaxPass", "FuseGeluPass"]


class FuseSoftmaxPass(Pass):
    """``Exp(x - max) / sum`` over one axis becomes ``Softmax``."""

    name = "fuse_softmax"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        return fuse_each(graph, "Div", self._fuse, self.name)

    def _fuse(self, div: Node, graph: Graph) -> int:
        e, s = div.inputs
        exp, rsum = producer(e, graph, "Exp"), producer(s, graph, "ReduceSum")
        sub = producer(exp.inputs[0], graph, "Sub") if exp else None
        rmax = producer(sub.inputs[1], graph, "ReduceMax") if sub else None
        if rmax is None or rsum is None or rsum.inputs[0] is not e or e.dtype not in FLOATS:
            return 0
        x = sub.inputs[0]
        ax_max, ax_sum = kept_axes(rmax), kept_axes(rsum)
        if rmax.inputs[0] is not x or ax_max is None or ax_max != ax_sum or len(ax_max) != 1:
            return 0
        if {u for u, _ in e.uses} != {rsum, div} or e in graph.outputs:
            return 0
        if not all(single_use(v, graph) for v in (rmax.outputs[0], sub.outputs[0], s)):
            return 0
        fused = fused_node(div, "Softmax", [x], [div.outputs[0]], attrs(axis=ax_max[0]), version=13)
        replace_chain(graph, [rmax, sub, exp, rsum, div], fused)
        return 1


def _near(v: float | None, want: float) -> bool:
    return v is not None and abs(v - want) < 1e-4


class FuseGeluPass(Pass):
    """The erf form of GELU becomes ``Gelu``."""

    name = "fuse_gelu"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        return fuse_each(graph, "Erf", self._fuse, self.name)

    def _only(self, v, graph: Graph, op: str) -> Node | None:
        if not single_use(v, graph):
            return None
        n = v.uses[0][0]
        return n if n.graph is graph and n.op_type == op and not n.domain else None

    def _fuse(self, erf: Node, graph: Graph) -> int:
        scaled = producer(erf.inputs[0], graph)
        if scaled is None or scaled.outputs[0].dtype not in FLOATS:
            return 0
        c = scalar_const(scaled.inputs[1])
        ok = (scaled.op_type == "Div" and _near(c, math.sqrt(2))) or (
            scaled.op_type == "Mul" and _near(c, 1 / math.sqrt(2))
        )
        x = scaled.inputs[0]
        add = self._only(erf.outputs[0], graph, "Add")
        if not ok or add is None or not single_use(scaled.outputs[0], graph):
            return 0
        other = add.inputs[1] if add.inputs[0] is erf.outputs[0] else add.inputs[0]
        mul = self._only(add.outputs[0], graph, "Mul")
        if scalar_const(other) != 1.0 or mul is None:
            return 0
        y = mul.inputs[1] if mul.inputs[0] is add.outputs[0] else mul.inputs[0]
        half = producer(y, graph, "Mul")
        chain = [scaled, erf, add, mul]
        if y is x:  # (x * (1 + erf)) * 0.5
            last = self._only(mul.outputs[0], graph, "Mul")
            if last is None or not _near(scalar_const(last.inputs[1]), 0.5):
                return 0
            chain.append(last)
        elif half is not None and half.inputs[0] is x and single_use(y, graph):
            if not _near(scalar_const(half.inputs[1]), 0.5):
                return 0  # (x * 0.5) * (1 + erf)
            chain.insert(0, half)
        else:
            return 0
        fused = fused_node(chain[-1], "Gelu", [x], [chain[-1].outputs[0]], {}, version=20)
        replace_chain(graph, chain, fused)
        return 1
