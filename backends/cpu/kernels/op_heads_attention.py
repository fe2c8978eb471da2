"""``anychip::HeadsAttention`` (``backends/cpu/passes/fuse_heads.py``): a multi-head
attention with the heads' split and merge taken in, the nodes it replaces run as views inside
one kernel::

    q = Reshape(Q, shape_q).transpose(0, 2, 1, 3)       # [B, heads, S, D], a view
    kt = Reshape(K, shape_k).transpose(0, 2, 3, 1)      # [B, heads, D, T], one copy
    v = Reshape(V, shape_v).transpose(0, 2, 1, 3)       # a view
    Y = Reshape(FusedAttention(q, kt, v, mask).transpose(0, 2, 1, 3), shape_out)

The last product writes straight into the merged ``[B, S, heads, D]`` layout (numpy's matmul
takes a strided ``out`` whose rows are contiguous), so the merge costs no copy. The keys are
copied once: reading their ``[0, 2, 3, 1]`` view through BLAS took 15.4 us against 11.3 for a
contiguous copy, and the copy 1.6 (the tiny BERT's 2 x 128 x 16). ``Q``, ``K`` and ``V`` may be
strided (a Split's parts of one packed projection). Where the heads' leading dimensions
differ (broadcasting), the same operations run one after the other, with copies.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels import op_fused_attention
from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.kernels.op_fused_attention import _scaled_softmax, fused_attention
from anychip.backends.cpu.kernels.op_reshape import reshape, target_shape
from anychip.backends.cpu.kernels.op_split import _split
from anychip.backends.cpu.table import kernel
from anychip.codegen import omp, pool
from anychip.codegen.attention import attention
from anychip.codegen.rows import softmax_rows
from anychip.errors import KernelError
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["heads_attention"]


@kernel("HeadsAttention", domain=ANYCHIP_DOMAIN, since=1, dtypes=(DType.FLOAT, DType.DOUBLE))
def heads_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    shape_q: np.ndarray,
    shape_k: np.ndarray,
    shape_v: np.ndarray,
    shape_out: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    scale: float,
    divide: int = 1,
    allowzero: list[int] | tuple[int, ...] = (0, 0, 0, 0),
    split: list[int] | tuple[int, ...] = (),
    parts: list[int] | tuple[int, ...] = (),
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Split the heads, attend, merge the heads (the module docstring)."""
    if parts:  # Q, K and V are parts of one packed tensor, cut as its Split cut them
        cut = _split(q, -1, list(split) or None, parts[0])
        q, k, v = cut[parts[1]], cut[parts[2]], cut[parts[3]]
    zq, zk, zv, zo = allowzero
    q4 = _rank4(reshape(q, shape_q, allowzero=zq), "Q")
    k4 = _rank4(reshape(k, shape_k, allowzero=zk), "K")
    v4 = _rank4(reshape(v, shape_v, allowzero=zv), "V")
    qh = q4.transpose(0, 2, 1, 3)
    kt = np.ascontiguousarray(k4.transpose(0, 2, 3, 1))
    vh = v4.transpose(0, 2, 1, 3)
    lead = qh.shape[:2]
    if (
        kt.shape[:2] != lead
        or vh.shape[:2] != lead
        or qh.shape[3] != kt.shape[2]
        or kt.shape[3] != vh.shape[2]
        or q.dtype != k.dtype
        or q.dtype != v.dtype
        or not _mask_fits(mask, lead + (qh.shape[2], kt.shape[3]))
    ):  # broadcast heads, or shapes that do not chain: the ops one by one (their errors)
        y = fused_attention(qh, kt, vh, mask, scale=scale, divide=divide)
        return reshape(np.ascontiguousarray(y.transpose(0, 2, 1, 3)), shape_out, allowzero=zo)
    b, h, s, _ = qh.shape
    merged = (b, s, h, vh.shape[3])
    target = target_shape(merged, shape_out, zo)
    into = fits(out, target, q.dtype)
    y4 = out.reshape(merged) if into else np.empty(merged, q.dtype)
    _attend(qh, kt, vh, mask, scale, divide, y4.transpose(0, 2, 1, 3))
    return out if into else y4.reshape(target)


def _attend(
    q: np.ndarray,
    kt: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    scale: float,
    divide: int,
    y: np.ndarray,
) -> None:
    """``y[...] = softmax(q @ kt op scale + mask) @ v``; ``y`` a strided view."""
    op = 1 if divide else 2
    work = q.size * kt.shape[-1] * 2
    if q.dtype == np.float32 and work >= op_fused_attention.HEADS_SPLIT_WORK:  # its threshold
        threads = omp.max_threads()
        if threads > 1 and pool.try_parallel():
            r = attention(q, kt, v, mask, scale, op, threads)
            if r is not None:
                y[...] = r
                return
    scores = np.matmul(q, kt)
    if not softmax_rows(scores, scores, mask, scale, op):  # float32 in C, else numpy
        scores = _scaled_softmax(scores, mask, scale, divide)
    np.matmul(scores, v, out=y)


def _mask_fits(mask: np.ndarray | None, scores: tuple[int, ...]) -> bool:
    """Whether adding ``mask`` leaves the scores' shape as it is."""
    if mask is None:
        return True
    shape = mask.shape
    if len(shape) > len(scores):
        return False
    return all(m == 1 or m == s for m, s in zip(shape[::-1], scores[::-1]))


def _rank4(x: np.ndarray, name: str) -> np.ndarray:
    if x.ndim != 4:
        raise KernelError(
            f"HeadsAttention: {name} reshaped to {list(x.shape)}; the heads' layout needs rank 4 "
            "[batch, sequence, heads, head size]"
        )
    return x
