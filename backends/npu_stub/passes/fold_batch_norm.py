"""``FoldBatchNormPass``: Conv -> BatchNormalization becomes one Conv with scaled weights.

BatchNormalization in inference mode is ``a * x + b`` per channel, with
``a = scale / sqrt(var + eps)`` and ``b = bias - mean * a``; applied to a convolution's
output it equals the convolution with weights ``W * a`` (per output channel) and bias
``B * a + b``. Folded only when every parameter and the weights are constants and nothing
else reads the convolution's raw output.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.npu_stub.kernels.op_elementwise import batch_norm_affine
from anychip.backends.npu_stub.passes._rewrite import (
    Names,
    begin,
    constant,
    drop_dead,
    finish,
    new_node,
    single_use,
)
from anychip.ir.graph import Graph

__all__ = ["FoldBatchNormPass"]


class FoldBatchNormPass:
    """Fold BatchNormalization into the Conv (or unfused ``NpuConv``) that feeds it."""

    name = "fold_batch_norm"

    def __call__(self, graph: Graph) -> bool:
        """Rewrite ``graph`` in place; returns whether it changed."""
        begin(graph)
        names = Names(graph)
        modified = False
        for bn in list(graph.nodes):
            conv = self._foldable(bn, graph)
            if conv is None:
                continue
            w, b = conv.inputs[1], conv.inputs[2] if len(conv.inputs) > 2 else None
            params = [v.const for v in bn.inputs[1:5]]
            a, shift = batch_norm_affine(*params, float(bn.attr("epsilon", 1e-5)))
            w_new = (w.const * a.reshape(-1, 1, 1, 1)).astype(np.float32)
            b_old = b.const if b is not None else np.zeros_like(a)
            b_new = (b_old * a + shift).astype(np.float32)
            ins = [
                conv.inputs[0],
                constant(graph, names, f"{w.name}_bnfold", w_new),
                constant(graph, names, f"{bn.inputs[1].name}_bnfold_bias", b_new),
            ]
            y = bn.outputs[0]
            index = graph.nodes.index(conv)
            graph.remove(bn)
            attributes = dict(conv.attributes)
            folded = new_node(conv, conv.op_type, ins, [y], attributes, domain=conv.domain)
            graph.remove(conv)
            graph.insert(index, folded)
            modified = True
        if modified:
            drop_dead(graph)
        return finish(graph, self.name, modified)

    @staticmethod
    def _foldable(bn, graph: Graph):
        if bn.op_type != "BatchNormalization" or bn.domain or bn.graph is not graph:
            return None
        if bn.attr("training_mode", 0) or any(v is not None for v in bn.outputs[1:]):
            return None
        x = bn.inputs[0]
        conv = x.producer
        if conv is None or conv.graph is not graph or not single_use(x, graph):
            return None
        if (conv.domain, conv.op_type) not in (("", "Conv"), ("anychip", "NpuConv")):
            return None
        if conv.attr("activation", ""):
            return None  # BN after a fused activation is not affine in the conv output
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        if conv.inputs[1].const is None or (bias is not None and bias.const is None):
            return None
        if any(v is None or v.const is None for v in bn.inputs[1:5]):
            return None
        return conv
