"""``FuseChannelShufflePass``: ShuffleNet's channel shuffle, as exporters write it,

    a = Reshape(x, [N, g, C / g, H, W])
    b = Transpose(a, perm=[0, 2, 1, 3, 4])
    y = Reshape(b, x's shape)

becomes ``anychip::ChannelShuffle(x) {group=g}``: one node instead of three, one copy, and where
oneDNN runs the convolution after it, that copy is a oneDNN reorder straight into the
channels-last layout the convolution reads (``onednn/shuffle.py``), so the convolution does not
reorder its input again. Fires on static shapes only, each intermediate read once and not a
graph output.
"""

from __future__ import annotations

from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import (
    FLOATS,
    attrs,
    fuse_each,
    fused_node,
    producer,
    reader,
    replace_chain,
    single_use,
)

__all__ = ["FuseChannelShufflePass"]


def _static(shape: tuple | None) -> bool:
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


class FuseChannelShufflePass(Pass):
    """Reshape -> Transpose(axes 1, 2) -> Reshape back becomes ChannelShuffle."""

    name = "fuse_channel_shuffle"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        return fuse_each(graph, "Transpose", _fuse, self.name)


def _fuse(tr: Node, graph: Graph) -> int:
    a, b = tr.inputs[0], tr.outputs[0]
    first = producer(a, graph, "Reshape")
    if first is None:
        return 0
    last = reader(b, graph, "Reshape")
    if last is None or not single_use(a, graph):
        return 0
    x, y = first.inputs[0], last.outputs[0]
    if x is None or x.dtype not in FLOATS or not all(_static(v.shape) for v in (x, a, y)):
        return 0
    rank = len(x.shape)
    perm = tr.attr("perm", None)
    if rank < 2 or perm is None or [int(p) for p in perm] != [0, 2, 1] + list(range(3, rank + 1)):
        return 0
    n, c = x.shape[:2]
    if y.shape != x.shape or len(a.shape) != rank + 1 or a.shape[0] != n:
        return 0
    g = a.shape[1]
    if g * a.shape[2] != c or a.shape[3:] != x.shape[2:]:
        return 0
    fused = fused_node(
        tr, "ChannelShuffle", [x], [y], attrs(group=int(g)), domain="anychip", version=1
    )
    replace_chain(graph, [first, tr, last], fused)
    return 1
