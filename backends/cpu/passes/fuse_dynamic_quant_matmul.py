"""``FuseDynamicQuantMatMulPass``: a layer of onnxruntime's ``quantize_dynamic`` becomes one
``anychip::DynamicQuantMatMul`` (``kernels/op_dynamic_quant_matmul.py``), as onnxruntime's
own graph optimizer fuses it into ``DynamicQuantizeMatMul``.

Fires on ``DynamicQuantizeLinear(X) -> (Xq, xs, xz)``, ``Mul(xs, B_scale)`` (either order) and
``MatMulInteger(Xq, B, xz[, B_zero_point]) -> Cast(to=FLOAT) -> Mul`` by that product (either
order), with ``B`` a constant 2-D 8-bit array and ``B_scale`` a float32 constant of one or
``N`` values, each intermediate read only there; an ``Add`` of a float32 constant ``[N]``
after it is taken in. Where ``Xq``, ``xs`` or ``xz`` have other readers (a transformer's q,
k and v projections of one input), the ``DynamicQuantizeLinear`` stays and the fused node
reads its three outputs. Only where the C is built here (``native/qlinear.available``).
"""

from __future__ import annotations

from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import fused_node, record, single_use
from anychip.ir.value import Value
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["FuseDynamicQuantMatMulPass"]


class FuseDynamicQuantMatMulPass(Pass):
    """DynamicQuantizeLinear, MatMulInteger, Cast, Mul (and a bias Add) into one node."""

    name = "fuse_dynamic_quant_matmul"

    def call(self, graph: Graph) -> PassResult:
        from anychip.backends.cpu.native import qlinear

        if not qlinear.available():
            return PassResult(graph, False)
        fired = 0
        for node in list(graph.nodes):
            if node.graph is graph and node.op_type == "MatMulInteger" and not node.domain:
                fired += _fuse(node, graph)
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)


def _only_reader(v: Value | None, graph: Graph, op: str) -> Node | None:
    if v is None or not single_use(v, graph):
        return None
    node = v.uses[0][0]
    return node if node.op_type == op and not node.domain and node.graph is graph else None


def _other(node: Node, v: Value) -> Value | None:
    a, b = node.inputs[0], node.inputs[1]
    return b if a is v else a if b is v else None


def _fuse(mm: Node, graph: Graph) -> int:
    xq, b = mm.inputs[0], mm.inputs[1]
    dq = xq.producer if xq is not None else None
    if dq is None or dq.op_type != "DynamicQuantizeLinear" or dq.domain or dq.graph is not graph:
        return 0
    _, xs, xz = dq.outputs
    if len(mm.inputs) < 3 or mm.inputs[2] is not xz:
        return 0
    if b is None or b.const is None or b.const.ndim != 2 or b.const.dtype.itemsize != 1:
        return 0
    bz = mm.inputs[3] if len(mm.inputs) > 3 else None
    if bz is not None and bz.const is None:
        return 0
    n = b.const.shape[1]
    cast = _only_reader(mm.outputs[0], graph, "Cast")
    if cast is None or cast.attr("to") != DType.FLOAT.value:
        return 0
    mul = _only_reader(cast.outputs[0], graph, "Mul")
    sm = None if mul is None else _other(mul, cast.outputs[0])
    scale_mul = None if sm is None else sm.producer
    if (
        scale_mul is None
        or scale_mul.op_type != "Mul"
        or scale_mul.domain
        or not single_use(sm, graph)
    ):
        return 0
    bs = _other(scale_mul, xs)
    if bs is None or bs.const is None or bs.dtype != DType.FLOAT:
        return 0
    if bs.const.size != 1 and (bs.const.size != n or bs.const.shape[-1:] != (n,)):
        return 0  # one scale, or one per output column
    # the activations' quantization taken in where this product is its only reader; else
    # (q, k and v projections of one input) it stays, and its three outputs are read
    whole = single_use(xq, graph) and single_use(xz, graph) and single_use(xs, graph)
    chain = [dq, scale_mul, mm, cast, mul] if whole else [scale_mul, mm, cast, mul]
    inputs = [dq.inputs[0] if whole else xq, b, bz, bs, None]
    add = _only_reader(mul.outputs[0], graph, "Add")
    bias = None if add is None else _other(add, mul.outputs[0])
    if bias is not None and bias.const is not None and bias.dtype == DType.FLOAT:
        c = bias.const
        if c.size == n and c.shape[-1:] == (n,) and len(c.shape) <= len(mm.outputs[0].shape or ()):
            chain.append(add)
            inputs[4] = bias
    if not whole:
        inputs += [xs, xz]
    while inputs[-1] is None:
        inputs.pop()
    last = chain[-1]
    fused = fused_node(
        last, "DynamicQuantMatMul", inputs, [last.outputs[0]], {},
        domain=ANYCHIP_DOMAIN, version=1, name=mm.name,
    )  # fmt: skip
    index = min(graph.nodes.index(node) for node in chain)
    for node in reversed(chain):
        graph.remove(node)
    graph.insert(index, fused)
    return 1
