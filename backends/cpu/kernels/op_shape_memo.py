"""``anychip::ShapeMemo`` (``backends/cpu/passes/memo_shapes.py``): a body graph that reads
only its inputs' shapes, run once per input signature; its results are kept on the node
(``node.meta["shape_memo"]``, the last ``KEEP`` signatures) and returned read-only after."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.core.run.program import KernelContext
from anychip.ir.graph import Graph
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["shape_memo", "KEEP"]

#: Input signatures whose results a node keeps (least recently used dropped first).
KEEP = 8


def _kept(x: Any) -> Any:
    if type(x) is np.ndarray:
        x = np.array(x, copy=True)  # its own memory: a nested program may reuse its buffers
        x.setflags(write=False)
    return x


@kernel("ShapeMemo", domain=ANYCHIP_DOMAIN, since=1, context=True)
def shape_memo(ctx: KernelContext, *xs: Any, body: Graph) -> tuple:
    """The body's outputs for inputs of these shapes and types (computed on first sight)."""
    key = tuple(
        (x.shape, x.dtype) if type(x) is np.ndarray else (np.shape(x), str(type(x))) for x in xs
    )  # numpy dtypes hash as themselves (str() of one took 1 us)
    memo = ctx.node.meta.get("shape_memo")
    if memo is None:
        memo = ctx.node.meta["shape_memo"] = OrderedDict()
    hit = memo.get(key)
    if hit is None:
        hit = tuple(_kept(o) for o in ctx.run_graph(body, list(xs)))
        memo[key] = hit
        while len(memo) > KEEP:
            memo.popitem(last=False)
    else:
        memo.move_to_end(key)
    return hit
