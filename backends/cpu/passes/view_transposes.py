"""``ViewTransposesPass``: a Transpose whose only reader takes a strided input as fast as a
contiguous one becomes ``anychip::TransposeView``, a view instead of a copy.

The readers: ``anychip::FusedAttention``'s queries (input 0) and values (input 2). Its kernel
multiplies them with numpy's matmul, which reads each [S, D] matrix of a view through BLAS when
its rows are contiguous, so the permutation must keep the last axis last (the exporters'
``[B, S, H, D] -> [B, H, S, D]``: 11.3 us for Q @ Kt with Q a view, 11.3 contiguous, at the
tiny BERT's 2 x 128 x 16). The keys are left as they are: their ``[B, S, H, D] -> [B, H, D, S]``
puts the rows' elements apart, and the product read from that view took 15.1 us.

The view's memory is its input's: the planner keeps the input alive while the view lives
(the kernel is registered ``alias=True``). In the tiny Hugging Face exports four of the eight
Transposes around the attention go (hf_gpt2_tiny 619 -> 590 us a run, 1 thread, CPU time).
"""

from __future__ import annotations

from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import attrs, fused_node, record

__all__ = ["ViewTransposesPass"]

#: ``(domain, op) -> input positions`` read as fast through a view with a contiguous last axis.
STRIDED_READERS: dict[tuple[str, str], tuple[int, ...]] = {("anychip", "FusedAttention"): (0, 2)}


class ViewTransposesPass(Pass):
    """Transposes read only where a strided input costs nothing become views."""

    name = "view_transposes"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        fired = 0
        for node in list(graph.nodes):
            if node.op_type == "Transpose" and not node.domain and _viewable(node, graph):
                fired += _rewrite(node, graph)
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)


def _viewable(node: Node, graph: Graph) -> bool:
    x, y = node.inputs[0], node.outputs[0]
    if x is None or y is None or y in graph.outputs or x.shape is None:
        return False
    if x.dtype not in (DType.FLOAT, DType.DOUBLE):
        return False
    perm = node.attr("perm", None)
    if perm is None or sorted(perm) != list(range(len(x.shape))) or perm[-1] != len(perm) - 1:
        return False
    uses = list(y.uses)
    return len(uses) >= 1 and all(
        user.graph is graph and i in STRIDED_READERS.get((user.domain, user.op_type), ())
        for user, i in uses
    )


def _rewrite(node: Node, graph: Graph) -> int:
    perm = [int(p) for p in node.attr("perm")]
    view = fused_node(
        node,
        "TransposeView",
        [node.inputs[0]],
        [node.outputs[0]],
        attrs(perm=perm),
        domain="anychip",
        version=1,
    )
    index = graph.nodes.index(node)
    graph.remove(node)
    graph.insert(index, view)
    return 1
