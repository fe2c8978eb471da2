"""``FuseGemmPass``: MatMul of a 2-D input by a constant 2-D matrix, + a bias Add [+ an
activation] becomes ``com.microsoft::FusedGemm(A, B, C)`` with ``activation`` (and
``activation_alpha``/``activation_beta``), onnxruntime's signature.

Fires when the bias is a float32 constant of ``N`` elements (``[N]`` or ``[1, N]``), each
intermediate has one reader and is not a graph output, the activation is one FusedGemm
computes (Relu, Tanh, Sigmoid, LeakyRelu, HardSigmoid), and, as for FusedConv, the CPU's
FusedGemm kernel is a fast one (``require_fast_kernel``). The numpy kernel is marked fast:
the form this pass makes (alpha = beta = 1, Relu or no activation) runs in place in planned
memory as the unfused MatMul did (other activations allocate, as it once did for all).

An activation of rank 3 or more (a transformer's ``[batch, seq, hidden]`` before its heads
are split) times a constant 2-D weight, + a bias along the last axis (``[N]``, ``[1, N]``,
``[1, 1, N]``; no wider than the product), becomes ``anychip::MatMulAdd(A, B, C)`` instead,
activation or not (the tiny BERT export: six MatMul + Add pairs, 6 us and a dispatch each).
"""

from __future__ import annotations

from anychip.backends.cpu.passes._common import fast_kernel
from anychip.backends.cpu.passes.fuse_conv import activation_of
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import FLOATS, attrs, fuse_each, fused_node, reader, replace_chain
from anychip.opsets.com_microsoft import MS_DOMAIN
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["FuseGemmPass", "fast_fused_gemm"]


def fast_fused_gemm() -> bool:
    """Whether the CPU's FusedGemm kernel is fast (``_common.fast_kernel``)."""
    from anychip.backends.cpu.kernels import op_contrib_transformer

    return fast_kernel(MS_DOMAIN, "FusedGemm", op_contrib_transformer.fused_gemm)


class FuseGemmPass(Pass):
    """Fuse MatMul + bias Add [+ activation] into FusedGemm."""

    name = "fuse_gemm"
    #: Fire only when ``fast_fused_gemm()`` (the tests set it False to test the rewrite).
    require_fast_kernel = True

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        if not any(n.op_type == "MatMul" and not n.domain for n in graph.nodes):
            return PassResult(graph, False)  # before importing the FusedGemm kernels
        if self.require_fast_kernel and not fast_fused_gemm():
            return PassResult(graph, False)
        return fuse_each(graph, "MatMul", self._fuse, self.name)

    def _fuse(self, mm: Node, graph: Graph) -> int:
        a, b = mm.inputs
        if len(a.shape or ()) >= 3:
            return _matmul_add(mm, graph)
        if len(a.shape or ()) != 2 or b.const is None or b.const.ndim != 2 or a.dtype != 1:
            return 0
        add = reader(mm.outputs[0], graph)
        if add is None or add.op_type != "Add":
            return 0
        c = add.inputs[1] if add.inputs[0] is mm.outputs[0] else add.inputs[0]
        width = b.const.shape[1]
        if c is None or c.const is None or c.dtype != 1 or c.const.size != width:
            return 0
        if c.const.shape not in ((width,), (1, width)):
            return 0
        chain, tail, extra = [mm, add], add.outputs[0], {}
        act = reader(add.outputs[0], graph)
        found = activation_of(act) if act is not None else None
        if found is not None and found[0] != "Clip":
            chain.append(act)
            tail = act.outputs[0]
            extra = {"activation": found[0]}
            for name, value in zip(("activation_alpha", "activation_beta"), found[1]):
                extra[name] = float(value)
        fused = fused_node(
            mm, "FusedGemm", [a, b, c], [tail], attrs(**extra), domain=MS_DOMAIN, version=1
        )
        replace_chain(graph, chain, fused)
        return 1


def _matmul_add(mm: Node, graph: Graph) -> int:
    """MatMul of an N-D activation by a constant 2-D weight + a last-axis bias -> MatMulAdd."""
    a, b = mm.inputs
    if b.const is None or b.const.ndim != 2 or a.dtype not in FLOATS or b.dtype != a.dtype:
        return 0
    add = reader(mm.outputs[0], graph)
    if add is None or add.op_type != "Add" or add.inputs[0] is add.inputs[1]:
        return 0
    c = add.inputs[1] if add.inputs[0] is mm.outputs[0] else add.inputs[0]
    width = b.const.shape[1]
    if c is None or c.const is None or c.dtype != a.dtype or c.const.ndim > len(a.shape):
        return 0
    if c.const.shape[-1:] != (width,) or c.const.size != width:
        return 0
    fused = fused_node(
        mm, "MatMulAdd", [a, b, c], [add.outputs[0]], {}, domain=ANYCHIP_DOMAIN, version=1
    )
    replace_chain(graph, [mm, add], fused)
    return 1
