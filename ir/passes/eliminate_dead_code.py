"""``EliminateDeadCodePass``: drop nodes none of whose outputs is used or a graph output."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anychip.ir.passes.base import Pass, PassResult

if TYPE_CHECKING:
    from anychip.ir.graph import Graph

__all__ = ["EliminateDeadCodePass"]


class EliminateDeadCodePass(Pass):
    """Removes unused nodes, last to first, so whole dead chains go in one call.

    Nodes with nested graphs are kept when their outputs are unused only if they could have
    side effects; ONNX operators have none, so they are removed like any other.
    """

    def call(self, graph: Graph) -> PassResult:
        outputs = set(graph.outputs)
        modified = False
        for node in reversed(list(graph.nodes)):
            live = any(v is not None and (v.uses or v in outputs) for v in node.outputs)
            if not live:
                graph.remove(node)
                modified = True
        unused = [
            k
            for k, v in graph.initializers.items()
            if not v.uses and v not in outputs and v not in graph.inputs
        ]
        for k in unused:
            del graph.initializers[k]
        return PassResult(graph, modified or bool(unused))
