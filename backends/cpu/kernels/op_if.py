"""If: run one of two nested graphs chosen by a boolean scalar.

The chosen branch runs through ``KernelContext.run_graph``, so values it reads from enclosing
scopes come from the running frame. Branch outputs may be tensors, sequences or optionals
(opset 13 and 16 widen the types); the kernel passes them through unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.core.run.program import KernelContext
from anychip.errors import KernelError
from anychip.ir.graph import Graph

__all__ = ["if_"]


@kernel("If", since=1, context=True)
def if_(ctx: KernelContext, cond: Any, *, then_branch: Graph, else_branch: Graph) -> tuple:
    c = np.asarray(cond)
    if c.size != 1:
        raise KernelError(
            f"If: the condition must hold exactly one element, got shape {list(c.shape)}"
        )
    branch = then_branch if bool(c.reshape(-1)[0]) else else_branch
    outs = ctx.run_graph(branch, [])
    if len(outs) != ctx.num_outputs:
        raise KernelError(
            f"If: branch {branch.name!r} produced {len(outs)} outputs but the node declares "
            f"{ctx.num_outputs}; both branches must return as many outputs as the If node"
        )
    return tuple(outs)
