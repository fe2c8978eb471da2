"""``FuseQdqMatMulPass``: a QDQ model's ``MatMul``/``Gemm`` of a dequantized activation by
dequantized constant weights becomes ``anychip::DequantMatMul``, an integer product (the
onnxruntime CPU provider's QDQ fusion into its int8 GEMM).

Fires on ``MatMul(DequantizeLinear(Aq, sa, za), B)`` and ``Gemm`` of the same with
``alpha = 1``, no ``transA`` and ``beta`` 1 with a float32 constant bias of ``N`` values (or
no bias), where ``B`` is a 2-D float32 constant folded from a ``DequantizeLinear`` of 8-bit
weights (``meta["dequantized"]``, ``ir/passes/fold_constants.py``) with its scale common or
per output column, ``sa``/``za`` are one value each, and the CPU sums 8-bit products exactly
(``onednn/int8.exact_here``: VNNI or AMX; elsewhere the float product is as fast and the
pass leaves the graph alone). The activation's ``DequantizeLinear`` is removed when the
product was its only reader.
"""

from __future__ import annotations

from anychip.backends.cpu.kernels.op_dequant_matmul import column_scale
from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import attrs, fused_node, record
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["FuseQdqMatMulPass"]


class FuseQdqMatMulPass(Pass):
    """QDQ MatMul/Gemm into an integer product."""

    name = "fuse_qdq_matmul"

    def call(self, graph: Graph) -> PassResult:
        from anychip.backends.cpu.onednn import _lib
        from anychip.backends.cpu.onednn.int8 import exact_here

        if not exact_here() or not _lib.findable():
            return PassResult(graph, False)
        fired = 0
        for node in list(graph.nodes):
            if node.graph is graph and not node.domain and node.op_type in ("MatMul", "Gemm"):
                fired += _fuse(node, graph)
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)


def _one_value(v) -> bool:
    return v is not None and v.const is not None and v.const.size == 1


def _fuse(mm: Node, graph: Graph) -> int:
    a, b = mm.inputs[0], mm.inputs[1]
    c = mm.inputs[2] if len(mm.inputs) > 2 else None
    dq = a.producer if a is not None else None
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain or dq.graph is not graph:
        return 0
    aq, sa = dq.inputs[0], dq.inputs[1]
    za = dq.inputs[2] if len(dq.inputs) > 2 else None
    if aq is None or aq.dtype not in (DType.UINT8, DType.INT8):
        return 0
    if not _one_value(sa) or not _one_value(za):  # one scale and zero point
        return 0
    meta = b.meta.get("dequantized") if b is not None and b.const is not None else None
    if (
        meta is None
        or b.const.ndim != 2
        or b.dtype != DType.FLOAT
        or meta["q"].shape != b.const.shape
    ):
        return 0
    trans = False
    if mm.op_type == "Gemm":
        if mm.attr("transA", 0) or float(mm.attr("alpha", 1.0)) != 1.0:
            return 0
        trans = bool(mm.attr("transB", 0))
        if c is not None:
            n = b.const.shape[0] if trans else b.const.shape[1]
            if float(mm.attr("beta", 1.0)) != 1.0 or c.const is None or c.dtype != DType.FLOAT:
                return 0
            if c.const.size != n or c.const.shape not in ((n,), (1, n)):
                return 0
    elif len(aq.shape or ()) < 2:
        return 0
    n = b.const.shape[0] if trans else b.const.shape[1]
    if column_scale(meta, trans, n) is None:
        return 0
    inputs = [aq, sa, za, b] + ([c] if c is not None else [])
    fused = fused_node(
        mm, "DequantMatMul", inputs, [mm.outputs[0]], attrs(transB=int(trans)),
        domain=ANYCHIP_DOMAIN, version=1,
    )  # fmt: skip
    index = graph.nodes.index(mm)
    graph.remove(mm)
    graph.insert(index, fused)
    if not a.uses and a not in graph.outputs:  # the activation's DequantizeLinear: unread
        graph.remove(dq)
    return 1
