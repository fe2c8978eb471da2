"""``FoldConstantsPass``: evaluate nodes whose inputs are all constants, once, at load time.

The evaluation itself is delegated (``evaluate(node, inputs) -> outputs``) so the IR does
not depend on any backend; the session passes one built on the CPU kernels. Nodes that are
random, hold nested graphs, or produce non-tensor values are left alone, as are results
larger than ``max_bytes`` (folding would trade a cheap op for a large constant).

A folded ``DequantizeLinear`` of 8-bit constants (a QDQ model's weights) leaves its integers,
scale, zero point and axis in the result's ``meta["dequantized"]`` (the arrays, not copies):
a backend's pass may still compute with the integers (the CPU's ``fuse_qdq_matmul``).
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
            dequantized = _dequantized(node, ins)
            for v, a in zip(node.outputs, arrays):
                if v is None or a is None:
                    continue
                if dequantized is not None:  # the integers behind the folded weights
                    v.meta["dequantized"] = dequantized
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


def _dequantized(node: Node, ins: list[Any]) -> dict[str, Any] | None:
    """What a folded DequantizeLinear of 8-bit integers was made of, or None."""
    if node.op_type != "DequantizeLinear" or node.domain or not ins or ins[0] is None:
        return None
    q = np.asarray(ins[0])
    if q.dtype not in (np.int8, np.uint8) or len(ins) < 2 or ins[1] is None:
        return None
    if node.attr("block_size", 0):
        return None
    zp = ins[2] if len(ins) > 2 else None
    return {"q": q, "scale": np.asarray(ins[1]), "zero_point": zp, "axis": node.attr("axis", 1)}
