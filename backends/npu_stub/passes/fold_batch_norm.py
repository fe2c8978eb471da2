"""``FoldBatchNormPass``: Conv -> BatchNormalization becomes one Conv with scaled weights.

The fold itself is the shared one (``ir/passes/fold_batch_norm.py``); the NPU also folds into
its unfused ``NpuConv`` and records the pass for its compile report.
"""

from __future__ import annotations

from anychip.backends.npu_stub.passes._rewrite import begin, finish
from anychip.ir.graph import Graph
from anychip.ir.passes.fold_batch_norm import fold_batch_norm

__all__ = ["FoldBatchNormPass"]

_CONVS = (("", "Conv"), ("anychip", "NpuConv"))


class FoldBatchNormPass:
    """Fold BatchNormalization into the Conv (or unfused ``NpuConv``) that feeds it."""

    name = "fold_batch_norm"

    def __call__(self, graph: Graph) -> bool:
        """Rewrite ``graph`` in place; returns whether it changed."""
        begin(graph)
        # BN after a fused activation is not affine in the conv's output.
        folded = fold_batch_norm(
            graph, _CONVS, accept=lambda conv, _bn: not conv.attr("activation", "")
        )
        return finish(graph, self.name, folded > 0)
