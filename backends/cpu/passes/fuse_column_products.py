"""``ReduceProd(ArrayFeatureExtractor(X, columns), axis 1)`` inputs of a Concat become one
``anychip::ColumnProducts`` node (skl2onnx's PolynomialFeatures: one gather and one product
per output feature, 180 nodes for 12 features at degree 2, each paying the session's
dispatch, where the whole is one gather and one product over a ``[rows, features, degree]``
array).

Fires on each maximal run of consecutive Concat inputs (axis 1 or -1) that are such products
of the same 2-D ``X`` with constant column lists, ``keepdims=1``, read once and not graph
outputs; the run is replaced by the fused node's single ``[rows, run length]`` output, in
place, so the Concat's result (and its other inputs) are unchanged.
"""

from __future__ import annotations

from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import (
    Names,
    attrs,
    fuse_each,
    fused_node,
    kept_axes,
    producer,
    single_use,
)
from anychip.ir.value import Value
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["FuseColumnProductsPass"]

#: Fewer products than this in a run: left as they are.
MIN_RUN = 3


def _product(v: Value, graph: Graph) -> tuple[Value, list[int]] | None:
    """``(X, columns)`` when ``v`` is ``ReduceProd(ArrayFeatureExtractor(X, const), [1])``
    with both intermediates read once, else None."""
    rp = producer(v, graph, "ReduceProd")
    if rp is None:
        return None
    if kept_axes(rp) not in ([1], [-1]) or not single_use(v, graph):
        return None
    col = rp.inputs[0]
    afe = col.producer
    if afe is None or afe.graph is not graph or afe.op_type != "ArrayFeatureExtractor":
        return None
    if afe.domain != "ai.onnx.ml" or not single_use(col, graph):
        return None
    x, idx = afe.inputs
    if idx is None or idx.const is None or idx.const.dtype.kind not in "iu" or idx.const.ndim > 1:
        return None
    if x.shape is None or len(x.shape) != 2 or x.dtype != v.dtype:
        return None
    n = x.shape[1]
    cols = [int(c) for c in idx.const.reshape(-1)]
    if not isinstance(n, int) or any(not 0 <= c < n for c in cols):
        return None  # the kernels' own errors word a bad index
    return x, cols


class FuseColumnProductsPass(Pass):
    """Runs of column products in a Concat become ``anychip::ColumnProducts``."""

    name = "fuse_column_products"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        names = Names(graph)

        def fuse(cat: Node, g: Graph) -> int:
            return self._fuse(cat, g, names) if cat.attr("axis", None) in (1, -1) else 0

        return fuse_each(graph, "Concat", fuse, self.name)

    def _fuse(self, cat: Node, graph: Graph, names: Names) -> int:
        found = [_product(v, graph) if v is not None else None for v in cat.inputs]
        ins: list[Value | None] = []
        fired, i = 0, 0
        while i < len(found):
            j = i
            while j < len(found) and found[j] is not None and found[j][0] is found[i][0]:
                j += 1
            if j - i >= MIN_RUN:
                ins.append(self._replace(cat, graph, names, cat.inputs[i:j], found[i:j]))
                fired += 1
            else:
                ins.extend(cat.inputs[i : max(j, i + 1)])
            i = max(j, i + 1)
        if fired:
            new_cat = fused_node(cat, "Concat", ins, list(cat.outputs), dict(cat.attributes))
            index = graph.nodes.index(cat)
            graph.remove(cat)
            graph.insert(index, new_cat)
        return fired

    def _replace(self, cat: Node, graph: Graph, names: Names, vals: list, found: list) -> Value:
        x = found[0][0]
        cols = [c for _, c in found]
        flat = [c for cs in cols for c in cs]
        out = Value(names.fresh("column_products"), x.dtype, (x.shape[0], len(cols)))
        a = attrs(columns=flat, lengths=[len(c) for c in cols])
        node = fused_node(
            cat, "ColumnProducts", [x], [out], a, domain=ANYCHIP_DOMAIN, version=1, name=out.name
        )
        for v in vals:
            rp = v.producer
            afe = rp.inputs[0].producer
            graph.remove(rp)
            graph.remove(afe)
        graph.insert(graph.nodes.index(cat), node)
        return out
