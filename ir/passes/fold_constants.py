"""``FoldConstantsPass``: evaluate nodes whose inputs are all constants, once, at load time.

The evaluation itself is delegated (``evaluate(node, inputs) -> outputs``) so the IR does
not depend on any backend; the session passes one built on the CPU kernels. Nodes that are
random, hold nested graphs, or produce non-tensor values are left alone, as are results
larger than ``max_bytes`` (folding would trade a cheap op for a large constant).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.ir.dtypes import DType
from anychip.ir.passes.base import Pass, PassResult

if TYPE_CHECKING:
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["FoldConstantsPass"]

_NONDETERMINISTIC = frozenset(
    {
        "RandomUniform",
        "RandomNormal",
        "RandomUniformLike",
        "RandomNormalLike",
        "Bernoulli",
        "Multinomial",
        "Dropout",
    }
)

Evaluator = Callable[["Node", Sequence[Any]], Sequence[Any]]


class FoldConstantsPass(Pass):
    """Replaces constant subexpressions with initializers."""

    def __init__(self, evaluate: Evaluator, max_bytes: int = 1 << 30) -> None:
        self.evaluate = evaluate
        self.max_bytes = max_bytes
        self.folded: list[str] = []

    def _foldable(self, node: Node, overridable: set) -> bool:
        if node.op_type in _NONDETERMINISTIC or node.subgraphs():
            return False
        if any(v is not None and not v.is_tensor for v in node.outputs):
            return False
        return all(v is None or (v.const is not None and v not in overridable) for v in node.inputs)

    def call(self, graph: Graph) -> PassResult:
        overridable = set(graph.inputs)
        modified = False
        for node in list(graph.nodes):
            if not self._foldable(node, overridable):
                continue
            # Checked before the allocation, not after, from the outputs' inferred shapes
            # (ConstantOfShape, Expand, Tile: the ops that grow tensors from constants).
            if any(v is not None and (v.nbytes or 0) > self.max_bytes for v in node.outputs):
                continue
            ins = [None if v is None else v.const for v in node.inputs]
            try:
                outs = self.evaluate(node, ins)
            except Exception:
                continue
            arrays = [np.asarray(o) if o is not None else None for o in outs]
            if any(a is not None and a.nbytes > self.max_bytes for a in arrays):
                continue
            for v, a in zip(node.outputs, arrays):
                if v is None or a is None:
                    continue
                v.const = a
                v.dtype = DType.from_numpy(a.dtype) if a.dtype != object else DType.STRING
                v.shape = tuple(a.shape)
                v.producer = None
                graph.initializers[v.name] = v
            node.outputs = [None] * len(node.outputs)
            graph.remove(node)
            self.folded.append(node.name)
            modified = True
        return PassResult(graph, modified)
