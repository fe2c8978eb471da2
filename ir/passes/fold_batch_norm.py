"""``FoldBatchNormPass``: Conv -> BatchNormalization becomes one Conv with scaled weights.

BatchNormalization in inference mode is ``a * x + b`` per channel, with
``a = scale / sqrt(var + eps)`` and ``b = bias - mean * a``; applied to a convolution's output
it equals the convolution with weights ``W * a`` (per output channel) and bias ``B * a + b``
(onnxruntime's ConvBNFusion, TVM's FoldScaleAxis). The per-channel factors and the bias are
computed in float64; the weights are scaled in their own dtype, so folding a large model makes
no float64 copy of its weights. Folded only when the weights, the bias and every
statistic are constants of the right shape, the normalisation is per channel and in inference
form, and nothing else reads the convolution's raw output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from anychip.ir.passes.base import Pass, PassResult
from anychip.ir.passes.rewrite import Names, constant, new_node, single_use

if TYPE_CHECKING:
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["FoldBatchNormPass", "fold_batch_norm", "fold_affine_into_conv"]

_CONV = (("", "Conv"),)


def fold_batch_norm(
    graph: Graph,
    convs: Iterable[tuple[str, str]] = _CONV,
    accept: Callable[[Node, Node], bool] | None = None,
) -> int:
    """Fold every foldable BatchNormalization of ``graph`` into the conv that feeds it.

    Args:
        graph: Rewritten in place.
        convs: ``(domain, op_type)`` of the convolutions to fold into (their inputs are X, W
            and an optional per-output-channel bias, like ONNX Conv's).
        accept: ``accept(conv, bn)`` False keeps the pair as it is (a fused activation, a
            user's placement pin).

    Returns:
        The number of BatchNormalization nodes folded.
    """
    kinds = frozenset(convs)
    names = Names(graph)
    folded = 0
    for bn in list(graph.nodes):
        conv = _foldable(bn, graph, kinds)
        if conv is None or (accept is not None and not accept(conv, bn)):
            continue
        _fold_pair(graph, names, conv, bn)
        folded += 1
    return folded


def _fold_pair(graph: Graph, names: Names, conv: Node, bn: Node) -> None:
    """Replace ``conv -> bn`` by one conv (a function of its own, so no local keeps the old
    weights alive once it returns)."""
    scale, bias, mean, var = (v.const.astype(np.float64) for v in bn.inputs[1:5])
    a = scale / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    fold_affine_into_conv(graph, names, conv, bn, a, bias - mean * a, bn.inputs[1].name)


def fold_affine_into_conv(
    graph: Graph, names: Names, conv: Node, after: Node, a: np.ndarray, shift: np.ndarray, stem: str
) -> None:
    """Replace ``conv -> after``, where ``after`` computes ``y * a + shift`` per output
    channel (float64 vectors of the channel count), by one conv with weights ``W * a`` and bias
    ``B * a + shift``. The weights are scaled in their own dtype (a float32 product rounds as
    the float64 one cast back would), the bias in float64."""
    w = conv.inputs[1]
    b = conv.inputs[2] if len(conv.inputs) > 2 else None
    dt = w.const.dtype
    # One array of the weights' size and dtype: no float64 copy of large weights.
    w_new = w.const * a.astype(dt).reshape((-1,) + (1,) * (w.const.ndim - 1))
    b_old = b.const.astype(np.float64) if b is not None else 0.0
    b_new = (b_old * a + shift).astype(dt)
    ins = [
        conv.inputs[0],
        constant(graph, names, f"{w.name}_fold", w_new),
        constant(graph, names, f"{stem}_fold_bias", b_new),
    ]
    index = graph.nodes.index(conv)
    y = after.outputs[0]
    graph.remove(after)
    replacement = new_node(conv, conv.op_type, ins, [y], dict(conv.attributes), domain=conv.domain)
    graph.remove(conv)
    graph.insert(index, replacement)
    # Drop the unfolded constants now, and the removed conv's hold on them (the loop's
    # node list still holds the conv): a model's old and new weights are then never all
    # alive at once.
    for v in [w, b, *after.inputs]:
        if v is not None and not v.uses and graph.initializers.get(v.name) is v:
            if v not in graph.outputs and v not in graph.inputs:
                del graph.initializers[v.name]
    conv.inputs.clear()


def _foldable(bn: Node, graph: Graph, kinds: frozenset[tuple[str, str]]) -> Node | None:
    """The conv ``bn`` can be folded into, or None."""
    if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
        return None
    if bn.graph is not graph or len(bn.inputs) < 5:
        return None
    if bn.attr("training_mode", 0) or not bn.attr("spatial", 1):
        return None
    if any(v is not None and (v.uses or v in graph.outputs) for v in bn.outputs[1:]):
        return None  # training-form outputs are read: not the inference formula
    x = bn.inputs[0]
    conv = x.producer
    if conv is None or conv.graph is not graph or not single_use(x, graph):
        return None
    if (conv.domain, conv.op_type) not in kinds or len(conv.outputs) != 1:
        return None
    w = conv.inputs[1] if len(conv.inputs) > 1 else None
    b = conv.inputs[2] if len(conv.inputs) > 2 else None
    if w is None or w.const is None or w.const.dtype.kind not in "fV" or w.const.ndim < 3:
        return None
    channels = w.const.shape[0]
    if b is not None and (b.const is None or b.const.shape != (channels,)):
        return None
    for v in bn.inputs[1:5]:
        if v is None or v.const is None or v.const.shape != (channels,):
            return None
    return conv


class FoldBatchNormPass(Pass):
    """Fold BatchNormalization into the conv that feeds it (see ``fold_batch_norm``).

    Args:
        convs: ``(domain, op_type)`` of the convolutions to fold into (default ONNX Conv; the
            NPU adds its ``anychip::NpuConv``).
        accept: ``accept(conv, bn)`` False keeps a pair as it is.

    ``folded`` counts the nodes folded over every call.
    """

    name = "fold_batch_norm"

    def __init__(
        self,
        convs: Iterable[tuple[str, str]] = _CONV,
        accept: Callable[[Node, Node], bool] | None = None,
    ) -> None:
        self.convs = tuple(convs)
        self.accept = accept
        self.folded = 0

    def call(self, graph: Graph) -> PassResult:
        n = fold_batch_norm(graph, self.convs, self.accept)
        self.folded += n
        return PassResult(graph, n > 0)
