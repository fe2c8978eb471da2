"""``FuseQLinearMatMulAddPass``: a quantized linear layer becomes one
``anychip::QLinearMatMulAdd`` (``kernels/op_qlinear_matmul_add.py``), the product and both
requantizations in one C call: onnxruntime's QDQ and QOperator models of a MatMul with a
bias, whose small layers cost more in the calls between their ops than in their sums.

Fires on ``QLinearMatMul`` whose only reader is a ``com.microsoft`` ``QLinearAdd`` of a
constant 8-bit bias (with an output zero point), and on ``DequantMatMul`` (no bias; after
``fuse_qdq_matmul``) read only by ``QuantizeLinear`` -> ``DequantizeLinear`` -> ``Add`` of a
constant float32 bias -> ``QuantizeLinear``, each the only reader of the one before, per
tensor (one scale and zero point, no ``block_size``, ``output_dtype`` or ``precision``).
Only where the C is built here (``native/qlinear.available``): elsewhere the fused kernel
would run the same ops one by one.
"""

from __future__ import annotations

from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import attrs, fused_node, record, single_use
from anychip.ir.value import Value
from anychip.opsets.com_microsoft import MS_DOMAIN
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["FuseQLinearMatMulAddPass"]

_8BIT = (DType.UINT8, DType.INT8)


class FuseQLinearMatMulAddPass(Pass):
    """QLinearMatMul + QLinearAdd, or QDQ's DequantMatMul, Q, DQ, Add, Q, into one node."""

    name = "fuse_qlinear_matmul_add"

    def call(self, graph: Graph) -> PassResult:
        from anychip.backends.cpu.native import qlinear

        if not qlinear.available():
            return PassResult(graph, False)
        fired = 0
        for node in list(graph.nodes):
            if node.graph is not graph:
                continue
            if node.op_type == "QLinearMatMul" and not node.domain:
                fired += _fuse_qoperator(node, graph)
            elif node.op_type == "DequantMatMul" and node.domain == ANYCHIP_DOMAIN:
                fired += _fuse_qdq(node, graph)
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)


def _one(v: Value | None) -> bool:
    return v is not None and v.const is not None and v.const.size == 1


def _reader(v: Value, graph: Graph, op: str, domain: str = "") -> Node | None:
    """The only reader of ``v`` when it is an ``op`` node of ``graph`` (``v`` no output)."""
    if not single_use(v, graph):
        return None
    node = v.uses[0][0]
    ok = node.op_type == op and node.domain == domain and node.graph is graph
    return node if ok else None


def _width(v: Value) -> int | None:
    shape = v.shape or ()
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def _bias_fits(bias: Value, n: int | None) -> bool:
    c = bias.const
    return n is not None and c is not None and c.size == n and c.shape[-1:] == (n,)


def _replace(first: Node, last: Node, inputs: list, graph: Graph, **attributes: int) -> int:
    fused = fused_node(
        last, "QLinearMatMulAdd", inputs, [last.outputs[0]], attrs(**attributes),
        domain=ANYCHIP_DOMAIN, version=1, name=first.name,
    )  # fmt: skip
    index = graph.nodes.index(first)
    chain = [first]
    while chain[-1] is not last:
        chain.append(chain[-1].outputs[0].uses[0][0])
    for node in reversed(chain):
        graph.remove(node)
    graph.insert(index, fused)
    return 1


def _fuse_qoperator(mm: Node, graph: Graph) -> int:
    if len(mm.inputs) != 8 or mm.inputs[3] is None or mm.inputs[3].const is None:
        return 0
    b = mm.inputs[3].const
    add = _reader(mm.outputs[0], graph, "QLinearAdd", MS_DOMAIN)
    if add is None or b.ndim != 2 or b.dtype.itemsize != 1 or len(add.inputs) != 8:
        return 0
    side = 0 if add.inputs[0] is mm.outputs[0] else 3
    other = 3 - side
    bias = add.inputs[other]
    if bias is None or bias.dtype not in _8BIT or not _bias_fits(bias, b.shape[1]):
        return 0
    params = [add.inputs[i] for i in (side + 1, side + 2, other + 1, other + 2, 6, 7)]
    if not all(_one(p) for p in params) or add.inputs[7].dtype not in _8BIT:
        return 0
    ds, dz, bs, bz, s2, z2 = params
    return _replace(mm, add, [*mm.inputs, ds, dz, bias, bs, bz, s2, z2], graph, qdq=0)


def _per_tensor(node: Node | None) -> bool:
    if node is None or len(node.inputs) != 3 or not all(_one(v) for v in node.inputs[1:]):
        return False
    extra = ("block_size", "output_dtype", "precision")
    return not any(node.attr(a, 0) for a in extra) and node.inputs[2].dtype in _8BIT


def _fuse_qdq(mm: Node, graph: Graph) -> int:
    if len(mm.inputs) != 4:  # a bias of its own: left alone
        return 0
    q1 = _reader(mm.outputs[0], graph, "QuantizeLinear")
    dq = None if q1 is None else _reader(q1.outputs[0], graph, "DequantizeLinear")
    add = None if dq is None else _reader(dq.outputs[0], graph, "Add")
    q2 = None if add is None else _reader(add.outputs[0], graph, "QuantizeLinear")
    if not (_per_tensor(q1) and _per_tensor(dq) and _per_tensor(q2)) or add is None:
        return 0
    bias = add.inputs[1] if add.inputs[0] is dq.outputs[0] else add.inputs[0]
    if bias is None or bias.dtype != DType.FLOAT or not _bias_fits(bias, _width(mm.outputs[0])):
        return 0
    if len(bias.shape or ()) > len(mm.outputs[0].shape or ()):
        return 0
    inputs = [*mm.inputs, *q1.inputs[1:], *dq.inputs[1:], bias, *q2.inputs[1:]]
    return _replace(mm, q2, inputs, graph, qdq=1, transB=int(mm.attr("transB", 0)))
