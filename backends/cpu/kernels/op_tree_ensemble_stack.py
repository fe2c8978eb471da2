"""``anychip::TreeEnsembleStack`` (``backends/cpu/passes/fuse_tree_stack.py``): the tree
ensembles of ``body`` run on ``X`` with their own kernels (each sums its trees in its own
order), their scores reshaped and concatenated as the Reshape and Concat nodes it replaces do."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.core.kernel_call import KernelContext
from anychip.ir.graph import Graph
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["tree_ensemble_stack"]


@kernel("TreeEnsembleStack", domain=ANYCHIP_DOMAIN, since=1, context=True)
def tree_ensemble_stack(
    ctx: KernelContext, x: np.ndarray, *, body: Graph, shape: list[int], axis: int = 0
) -> np.ndarray:
    scores = ctx.run_graph(body, [x])
    return np.concatenate([np.reshape(s, shape) for s in scores], axis=axis)
