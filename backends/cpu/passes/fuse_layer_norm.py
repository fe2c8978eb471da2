"""``FuseLayerNormPass``: the layer normalization exporters write as nine ops becomes one
ONNX ``LayerNormalization`` (opset 17) over the last axis::

    mean = ReduceMean(x, axes=[-1]); d = Sub(x, mean); var = ReduceMean(Pow(d, 2) | Mul(d, d))
    y = Div(d, Sqrt(Add(var, eps))) [* gamma] [+ beta]

Fires only when both ReduceMeans reduce the last axis alone with ``keepdims=1``, ``eps``,
``gamma`` and ``beta`` are constants (``gamma``/``beta`` of the last axis' size), ``d`` is read
by exactly the Pow/Mul and the Div, and every other intermediate has one reader and is not a
graph output. Absent ``gamma``/``beta`` become ones/zeros.
"""

from __future__ import annotations

import numpy as np

from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import (
    Names,
    attrs,
    constant,
    fuse_each,
    fused_node,
    kept_axes,
    producer,
    reader,
    replace_chain,
    scalar_const,
    single_use,
)
from anychip.ir.value import Value

__all__ = ["FuseLayerNormPass"]


def _last_axis_mean(node: Node | None, rank: int) -> bool:
    if node is None or node.op_type != "ReduceMean":
        return False
    axes = kept_axes(node)
    return axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1)


def _other(node: Node, v: Value) -> Value | None:
    return node.inputs[1] if node.inputs[0] is v else node.inputs[0]


def _affine(node: Node | None, v: Value, width: int) -> np.ndarray | None:
    if node is None:
        return None
    c = _other(node, v)
    c = None if c is None else c.const
    if c is None or c.dtype != np.float32 or c.size != width or c.shape[-1:] != (width,):
        return None
    return c.reshape(width)


class FuseLayerNormPass(Pass):
    """Fuse the nine-op layer normalization into ``LayerNormalization``."""

    name = "fuse_layer_norm"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        names = Names(graph)
        return fuse_each(graph, "Div", lambda div, g: self._fuse(div, g, names), self.name)

    def _match(self, div: Node, graph: Graph) -> tuple | None:
        d, s = div.inputs
        sqrt = producer(s, graph, "Sqrt")
        sub = producer(d, graph, "Sub")
        add = producer(sqrt.inputs[0], graph, "Add") if sqrt else None
        if sub is None or add is None or d.dtype != 1 or d.shape is None:
            return None
        x, rank = sub.inputs[0], len(d.shape)
        mean = producer(sub.inputs[1], graph)
        var = next((v for v in add.inputs if producer(v, graph, "ReduceMean")), None)
        eps = scalar_const(_other(add, var)) if var is not None else None
        if eps is None or not _last_axis_mean(mean, rank) or mean.inputs[0] is not x:
            return None
        vmean = var.producer
        sq = producer(vmean.inputs[0], graph)
        if not _last_axis_mean(vmean, rank) or sq is None:
            return None
        is_sq = (sq.op_type == "Pow" and scalar_const(sq.inputs[1]) == 2.0) or (
            sq.op_type == "Mul" and sq.inputs[0] is d and sq.inputs[1] is d
        )
        readers = {u for u, _ in d.uses}
        if not is_sq or sq.inputs[0] is not d or readers != {sq, div} or d in graph.outputs:
            return None
        inner = [mean.outputs[0], sq.outputs[0], var, add.outputs[0], s]
        if not all(single_use(v, graph) for v in inner):
            return None
        return x, eps, [mean, sub, sq, vmean, add, sqrt, div]

    def _fuse(self, div: Node, graph: Graph, names: Names) -> int:
        found = self._match(div, graph)
        if found is None:
            return 0
        x, eps, chain = found
        width = x.shape[-1] if x.shape else None
        if not isinstance(width, int):
            return 0
        tail = div.outputs[0]
        mul = reader(tail, graph, "Mul")
        gamma = _affine(mul, tail, width)
        if gamma is not None:
            chain.append(mul)
            tail = mul.outputs[0]
        bias_add = reader(tail, graph, "Add")
        beta = _affine(bias_add, tail, width)
        if beta is not None:
            chain.append(bias_add)
            tail = bias_add.outputs[0]
        stem = div.name or "layer_norm"
        ones = np.ones(width, np.float32) if gamma is None else gamma
        zeros = np.zeros(width, np.float32) if beta is None else beta
        ins = [x, constant(graph, names, f"{stem}_scale", ones)]
        ins.append(constant(graph, names, f"{stem}_bias", zeros))
        a = attrs(axis=-1, epsilon=float(np.float32(eps)))
        fused = fused_node(div, "LayerNormalization", ins, [tail], a, version=17)
        replace_chain(graph, chain, fused)
        return 1
