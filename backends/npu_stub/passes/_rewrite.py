"""Graph-editing helpers of the NPU passes: the shared ones (``ir/passes/rewrite.py``) and
``drop_dead``."""

from __future__ import annotations

from anychip.ir.graph import Graph
from anychip.ir.passes import EliminateDeadCodePass
from anychip.ir.passes.rewrite import Names, attrs, constant, new_node, single_use

__all__ = ["Names", "single_use", "new_node", "attrs", "constant", "drop_dead"]


def drop_dead(graph: Graph) -> bool:
    """Remove nodes whose outputs nobody reads, and initializers nobody reads."""
    return EliminateDeadCodePass().call(graph).modified
