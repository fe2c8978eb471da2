"""``anychip::FusedAttention`` (``ir/passes/patterns/fuse_attention.py``):
``softmax(Q @ Kt (/ or *) scale [+ mask], last axis) @ V``, the unfused nodes' operations in
their order, in one scores buffer (scaled, masked and normalized in place); given two threads
or more and ``HEADS_SPLIT_WORK``, head by head on the pool (``cpu/native/attention.py``)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.kernels.op_softmax import _softmax
from anychip.backends.cpu.native import omp, pool
from anychip.backends.cpu.native.attention import attention
from anychip.backends.cpu.native.rows import softmax_rows
from anychip.backends.cpu.table import kernel
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["fused_attention", "HEADS_SPLIT_WORK"]

#: Multiply-adds (both products) from which the heads go to ``backends/cpu/native/pool.py``'s
# threads
#: (``backends/cpu/native/attention.py``): the BERT-like layer's 4 heads of 128x128x64 are 8.4M,
# 285-336
#: us on one thread.
HEADS_SPLIT_WORK = 1 << 22


@kernel("FusedAttention", domain=ANYCHIP_DOMAIN, since=1, dtypes=(DType.FLOAT, DType.DOUBLE))
def fused_attention(
    q: np.ndarray,
    kt: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    scale: float,
    divide: int = 1,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Scaled dot-product attention; ``divide``: the scores are divided by ``scale`` (else
    multiplied). Large enough, given two threads or more: head by head on the pool."""
    if q.dtype == np.float32 and q.size * kt.shape[-1] * 2 >= HEADS_SPLIT_WORK:
        threads = omp.max_threads()
        if threads > 1 and pool.try_parallel():
            y = attention(q, kt, v, mask, scale, 1 if divide else 2, threads, out)
            if y is not None:
                return y
    s = np.matmul(q, kt)
    if not softmax_rows(s, s, mask, scale, 1 if divide else 2):  # float32 in C, else numpy
        s = _scaled_softmax(s, mask, scale, divide)
    if s.shape[:-2] == v.shape[:-2]:  # np.broadcast_shapes takes ~2 us
        shape = s.shape[:-1] + v.shape[-1:]
    else:
        shape = np.broadcast_shapes(s.shape[:-2], v.shape[:-2]) + (s.shape[-2], v.shape[-1])
    if fits(out, shape, s.dtype):
        return np.matmul(s, v, out=out)
    return np.matmul(s, v)


def _scaled_softmax(s: np.ndarray, mask: np.ndarray | None, scale: float, divide: int):
    """The scores scaled, masked and normalized with numpy, in place where the mask fits."""
    c = s.dtype.type(scale)
    if divide:
        np.divide(s, c, out=s)
    else:
        np.multiply(s, c, out=s)
    if mask is not None:
        if np.broadcast_shapes(s.shape, mask.shape) == s.shape:
            np.add(s, mask, out=s)
        else:
            s = s + mask
    return _softmax(s, -1, out=s)
