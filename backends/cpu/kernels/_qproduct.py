"""The integer products of ``QLinearMatMul``, ``MatMulInteger``, ``QGemm`` and
``DequantMatMul`` with their requantization in one C call (``native/qlinear.py``).

A node's ``Product`` (its centered weights, scales and output zero point) is made once and
kept while the arrays it was made from come back (initializers: each run hands the same
objects); inputs that are not constants of the graph are never kept (a planned buffer is the
same object with other contents on the next run). Up to ``C_MAX_MACS`` multiply-adds the C
sums the product itself; above, oneDNN's int8 matmul (``onednn/int8.py``, exact with VNNI or
AMX) gives the int32 product and the C only requantizes it; where neither applies the caller
runs its numpy path. Decision 053 has the measurements behind the threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._ml_common import compiled
from anychip.backends.cpu.native.qlinear import Product
from anychip.backends.cpu.onednn.int8 import int_matmul

__all__ = ["C_MAX_MACS", "product_of", "run_product"]

#: Up to this many multiply-adds the C sums the product (one call, no fixed cost); above,
#: oneDNN's int8 primitive does, then the C requantizes. AMD EPYC (Zen 4, AVX-512 VNNI),
#: shared machine, best of 200, us, C / oneDNN + corrections + requantization: 16x64x64
#: 4.6 / 42; 32x128x128 11.6 / 47; 64x128x128 26 / 53; 64x128x256 45 / 65; 64x256x256 87 / 74.
C_MAX_MACS = 1 << 21


def product_of(
    ctx: Any,
    const_inputs: Sequence[int],
    arrays: tuple,
    build: Callable[[], Product | None],
    key: str = "qproduct",
) -> Product | None:
    """``build()``, kept for the node while ``arrays`` are the same objects and the node's
    inputs at ``const_inputs`` are constants of the graph (module docstring); ``key`` names
    it among what the node keeps. A kept None (a form the C does not take) is returned too."""
    inputs = getattr(getattr(ctx, "node", None), "inputs", None)
    if inputs is None:  # no IR node (a kernel called by hand): nothing is kept
        return _unsealable(build())
    cache: dict = compiled(ctx, dict)
    ids = tuple(map(id, arrays))  # the kept entry holds the arrays: no id is reused meanwhile
    hit = cache.get(key)
    if hit is not None and hit[0] == ids:
        return hit[1]
    for i in const_inputs:
        if i < len(inputs) and inputs[i] is not None and inputs[i].const is None:
            return _unsealable(build())  # its values may change: a replay may not skip it
    made = build()
    cache[key] = (ids, made, arrays)
    return made


def _unsealable(prod: Product | None) -> Product | None:
    if prod is not None:
        prod.sealable = False
    return prod


def run_product(
    prod: Product,
    a: np.ndarray,
    za: np.ndarray | None,
    b: np.ndarray,
    zb: np.ndarray | None,
    trans_b: bool = False,
    dyn: tuple[np.ndarray, np.ndarray | None] | None = None,
    seal: bool = False,
) -> np.ndarray | None:
    """``prod`` for ``a``: summed in C up to ``C_MAX_MACS``, else oneDNN's exact int32
    product requantized in C; None where neither applies (the caller's numpy path). ``dyn``
    and ``seal``: ``Product.__call__``'s (a caller that returns the result as it is seals:
    a replay then runs the noted C call alone)."""
    if a.ndim < 2 or a.dtype.itemsize != 1:
        return None
    if a.size * prod.n <= C_MAX_MACS:
        return prod(a, za, dyn=dyn, seal=seal)
    if dyn is not None:
        za = dyn[1]
    raw = int_matmul(a, b, za, zb, trans_b)
    if raw is None:
        return None
    return prod(a, None, raw=raw.reshape(-1, prod.n), dyn=None if dyn is None else (dyn[0], None))
