"""``FoldConvAffinePass``: a Conv followed by Mul or Add of a per-output-channel constant
becomes one Conv with scaled weights or a shifted bias (onnxruntime's ConvMulFusion and
ConvAddFusion, basic level).

Caffe-converted models write a BatchNorm as BatchNormalization (folded at load) and then a
"Scale" layer as ``Mul`` and ``Add`` by ``[C, 1, 1]`` constants: Inception-v2 has 69 such
pairs after its 69 convolutions. Unfolded, each pair runs as an element-wise pass over the
output, and the convolution must write NCHW for it (a reorder out of oneDNN's channels-last),
where folded the Conv, its bias and the following Relu are one FusedConv.

Fires when the Conv's weights (and bias, if any) are float constants, its output has one
reader and is not a graph output, and that reader is a default-domain Mul or Add whose other
operand is a constant of the weights' dtype holding one value per output channel: a scalar,
``[C, 1, ..., 1]`` of rank ``r - 1`` or ``[1, C, 1, ..., 1]`` of rank ``r`` (``r`` the
output's rank), so the output shape does not change. ``Mul``: ``W * k`` per output channel
and ``B * k``; ``Add``: ``B + k``. Computed in float64 and rounded once to the weights'
dtype; the result differs from the unfolded nodes by rounding only (tested against
onnxruntime and the unfolded graph).
"""

from __future__ import annotations

import numpy as np

from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.base import fixed_point, round_limit
from anychip.ir.passes.fold_batch_norm import fold_affine_into_conv
from anychip.ir.passes.rewrite import Names, record, single_use

__all__ = ["FoldConvAffinePass"]


def _per_channel(k: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``k`` as ``channels`` values, or None when it is not one value per output channel."""
    if k.size == 1 and k.ndim <= rank:
        return np.full(channels, k.reshape(-1)[0], np.float64)
    ones = (1,) * (rank - 2)
    if k.shape in ((channels, *ones), (1, channels, *ones)):
        return k.reshape(-1).astype(np.float64)
    return None


def _foldable(conv: Node, graph: Graph) -> tuple[Node, np.ndarray] | None:
    """The Mul/Add reading ``conv`` and its per-channel constant, or None."""
    if conv.graph is not graph or conv.domain or conv.op_type != "Conv" or len(conv.outputs) != 1:
        return None
    w = conv.inputs[1] if len(conv.inputs) > 1 else None
    b = conv.inputs[2] if len(conv.inputs) > 2 else None
    if w is None or w.const is None or w.const.dtype.kind != "f" or w.const.ndim < 3:
        return None
    if b is not None and (b.const is None or b.const.shape != w.const.shape[:1]):
        return None
    y = conv.outputs[0]
    if not single_use(y, graph):
        return None
    op = y.uses[0][0]
    if op.graph is not graph or op.domain or op.op_type not in ("Mul", "Add"):
        return None
    if len(op.inputs) != 2 or op.inputs[0] is op.inputs[1]:
        return None
    k = op.inputs[1] if op.inputs[0] is y else op.inputs[0]
    if k is None or k.const is None or k.const.dtype != w.const.dtype:
        return None
    per = _per_channel(k.const, w.const.shape[0], w.const.ndim)
    return None if per is None else (op, per)


def _fold(graph: Graph, names: Names, conv: Node, op: Node, k: np.ndarray) -> None:
    one, zero = np.ones_like(k), np.zeros_like(k)
    a, shift = (k, zero) if op.op_type == "Mul" else (one, k)
    fold_affine_into_conv(graph, names, conv, op, a, shift, conv.inputs[1].name)


class FoldConvAffinePass(Pass):
    """Fold per-channel Mul/Add constants after a Conv into its weights and bias."""

    name = "fold_conv_affine"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        names, fired = Names(graph), 0

        def fold_all() -> bool:  # a Conv -> Mul -> Add folds the Mul, then the Add
            nonlocal fired
            before = fired
            for conv in list(graph.nodes):
                found = _foldable(conv, graph)
                if found is not None:
                    _fold(graph, names, conv, *found)
                    fired += 1
            return fired > before

        fixed_point(self.name, fold_all, round_limit(graph))
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)
