"""Graph-editing helpers of the NPU passes: the shared ones (``ir/passes/rewrite.py``) plus
``begin``/``finish``, which record in the graph's meta what the NPU compiler reports."""

from __future__ import annotations

from anychip.ir.graph import Graph
from anychip.ir.passes import EliminateDeadCodePass
from anychip.ir.passes.rewrite import Names, attrs, constant, new_node, single_use

__all__ = ["Names", "begin", "finish", "single_use", "new_node", "attrs", "constant", "drop_dead"]


def begin(graph: Graph) -> None:
    """Remember the node count before the first NPU pass (reported by the compiler)."""
    graph.meta.setdefault("npu_nodes_before", len(graph.nodes))


def finish(graph: Graph, name: str, modified: bool) -> bool:
    """Record that pass ``name`` changed ``graph``; returns ``modified``."""
    if modified:
        graph.meta.setdefault("npu_passes", []).append(name)
    return modified


def drop_dead(graph: Graph) -> bool:
    """Remove nodes whose outputs nobody reads, and initializers nobody reads."""
    return EliminateDeadCodePass().call(graph).modified
