"""``anychip::ColumnProducts`` (made by ``passes/fuse_column_products.py``): products of
column lists of a 2-D input, one gather and one ``multiply.reduce`` for all outputs.

The lists are padded to the longest with an extra column of ones, so each output multiplies
its columns in the same order ReduceProd did, times exact ones.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._ml_common import compiled
from anychip.backends.cpu.table import kernel
from anychip.core.run.kernel_call import KernelContext
from anychip.errors import KernelError
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["column_products"]


def _index(columns: list[int], lengths: list[int], n: int) -> np.ndarray:
    """``[outputs, longest]`` column indices, padded with ``n`` (the column of ones)."""
    width = max(lengths, default=0)
    idx = np.full((len(lengths), max(width, 1)), n, dtype=np.intp)
    at = 0
    for j, k in enumerate(lengths):
        idx[j, :k] = columns[at : at + k]
        at += k
    return idx


@kernel("ColumnProducts", domain=ANYCHIP_DOMAIN, since=1, context=True)
def column_products(
    ctx: KernelContext, x: np.ndarray, *, columns: list[int], lengths: list[int]
) -> np.ndarray:
    if x.ndim != 2:
        raise KernelError(f"ColumnProducts needs a 2-D input, got shape {x.shape}")
    n = x.shape[1]
    cache: dict = compiled(ctx, dict)
    idx = cache.get(n)
    if idx is None:
        if sum(lengths) != len(columns) or any(not 0 <= c < n for c in columns):
            raise KernelError(
                f"ColumnProducts: columns {columns} / lengths {lengths} do not fit {n} features"
            )
        idx = cache[n] = _index(list(columns), list(lengths), n)
    padded = np.empty((x.shape[0], n + 1), x.dtype)
    padded[:, :n] = x
    padded[:, n] = 1
    return np.multiply.reduce(padded[:, idx], axis=2)
