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

from typing import Any

import numpy as np

from anychip.backends.cpu.kernels import op_fused_attention
from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.kernels.op_fused_attention import _scaled_softmax, fused_attention
from anychip.backends.cpu.kernels.op_reshape import reshape, target_shape
from anychip.backends.cpu.kernels.op_split import _split
from anychip.backends.cpu.native import omp, pool
from anychip.backends.cpu.native.attention import attention
from anychip.backends.cpu.native.rows import softmax_rows
from anychip.backends.cpu.replay import record as _replay
from anychip.backends.cpu.table import kernel
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
    key = _key(q, k, v, shape_q, shape_k, shape_v, shape_out, mask, allowzero, split, parts)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _plan(q, k, v, shape_q, shape_k, shape_v, shape_out, mask, allowzero, split, parts)
        if key is not None:
            if len(_PLANS) >= _PLANS_KEEP:
                _PLANS.pop(next(iter(_PLANS), None), None)  # safe beside another thread
            _PLANS[key] = plan
    if plan.cuts is not None:  # Q, K and V are parts of one packed tensor
        q, k, v = q[plan.cuts[0]], k[plan.cuts[1]], v[plan.cuts[2]]
    qh = q.reshape(plan.q4).transpose(0, 2, 1, 3)
    kt = _replay.contiguous(k.reshape(plan.k4).transpose(0, 2, 3, 1))
    vh = v.reshape(plan.v4).transpose(0, 2, 1, 3)
    if plan.merged is None:  # broadcast heads, or shapes that do not chain: the ops in turn
        y = fused_attention(qh, kt, vh, mask, scale=scale, divide=divide)
        return reshape(
            np.ascontiguousarray(y.transpose(0, 2, 1, 3)), shape_out, allowzero=allowzero[3]
        )
    into = fits(out, plan.target, q.dtype)
    y4 = out.reshape(plan.merged) if into else _replay.empty(plan.merged, q.dtype)
    if _attend(qh, kt, vh, mask, scale, divide, y4.transpose(0, 2, 1, 3)):
        _replay.seal()  # K's copy and the attention's calls, noted: all the node did
    return out if into else y4.reshape(plan.target)


def _attention_into(
    q: np.ndarray, kt: np.ndarray, v: np.ndarray, mask: Any, scale: float, op: int,
    threads: int, y: np.ndarray,
) -> None:  # fmt: skip
    """``attention`` on the pool, copied into the strided ``y`` (a replay's step)."""
    r = attention(q, kt, v, mask, scale, op, threads)
    if r is None:
        raise KernelError("HeadsAttention: the generated attention declined on replay")
    y[...] = r


class _Plan:
    """What a call's shapes decide, worked out once (``_plan``): the packed parts' slices,
    the heads' shapes, and the merged and output shapes (None: the general path)."""

    __slots__ = ("cuts", "q4", "k4", "v4", "merged", "target")

    def __init__(self, cuts: Any, q4: tuple, k4: tuple, v4: tuple, merged: Any, target: Any):
        self.cuts, self.q4, self.k4, self.v4 = cuts, q4, k4, v4
        self.merged, self.target = merged, target


#: Plans of recent calls, by the inputs' shapes, strides and types, the shape tensors' values
#: and the mask's shape: a model's calls repeat them (the tiny BERT's node: 12 us of Python
#: a call before, the Reshapes' and Split's checks over again).
_PLANS: dict[tuple, _Plan] = {}
_PLANS_KEEP = 64


def _key(q, k, v, sq, sk, sv, so, mask, allowzero, split, parts) -> tuple | None:
    shapes = (sq, sk, sv, so)
    if any(type(s) is not np.ndarray or s.dtype != np.int64 for s in shapes):
        return None
    return (
        q.shape, q.strides, q.dtype, k.shape, k.strides, k.dtype, v.shape, v.strides, v.dtype,
        q is k, k is v, sq.tobytes(), sk.tobytes(), sv.tobytes(), so.tobytes(),
        tuple(allowzero), tuple(split), tuple(parts), None if mask is None else mask.shape,
    )  # fmt: skip


def _plan(q, k, v, sq, sk, sv, so, mask, allowzero, split, parts) -> _Plan:
    """The checks of the Split, the Reshapes and the fast path, raising their errors."""
    cuts = None
    if parts:  # cut as the packed tensor's Split cut it (its checks and errors)
        pieces = _split(q, -1, list(split) or None, parts[0])
        starts = [0]
        for piece in pieces:
            starts.append(starts[-1] + piece.shape[-1])
        cuts = tuple((Ellipsis, slice(starts[i], starts[i + 1])) for i in parts[1:4])
        q, k, v = q[cuts[0]], k[cuts[1]], v[cuts[2]]
    zq, zk, zv, zo = allowzero
    q4 = _rank4(reshape(q, sq, allowzero=zq), "Q").shape
    k4 = _rank4(reshape(k, sk, allowzero=zk), "K").shape
    v4 = _rank4(reshape(v, sv, allowzero=zv), "V").shape
    lead, s, t = (q4[0], q4[2]), q4[1], k4[1]
    if (
        (k4[0], k4[2]) != lead
        or (v4[0], v4[2]) != lead
        or q4[3] != k4[3]
        or k4[1] != v4[1]
        or q.dtype != k.dtype
        or q.dtype != v.dtype
        or not _mask_fits(mask, lead + (s, t))
    ):
        return _Plan(cuts, q4, k4, v4, None, None)
    merged = (q4[0], s, q4[2], v4[3])
    return _Plan(cuts, q4, k4, v4, merged, target_shape(merged, so, zo))


def _attend(
    q: np.ndarray,
    kt: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    scale: float,
    divide: int,
    y: np.ndarray,
) -> bool:
    """``y[...] = softmax(q @ kt op scale + mask) @ v``; ``y`` a strided view. Returns
    whether every step was a call noted for a replay (``backends/cpu/replay/record.py``)."""
    op = 1 if divide else 2
    work = q.size * kt.shape[-1] * 2
    if q.dtype == np.float32 and work >= op_fused_attention.HEADS_SPLIT_WORK:  # its threshold
        threads = omp.max_threads()
        if threads > 1 and pool.try_parallel():
            r = attention(q, kt, v, mask, scale, op, threads)
            if r is not None:
                y[...] = r
                if _replay.ACTIVE:
                    _replay.note(_attention_into, (q, kt, v, mask, scale, op, threads, y))
                return True
    shape = np.broadcast_shapes(q.shape[:-2], kt.shape[:-2]) + (q.shape[-2], kt.shape[-1])
    scores = _replay.empty(shape, np.result_type(q, kt))
    np.matmul(q, kt, out=scores)
    noted = softmax_rows(scores, scores, mask, scale, op)  # float32 in C, else numpy
    if not noted:
        scores = _scaled_softmax(scores, mask, scale, divide)
    np.matmul(scores, v, out=y)
    if noted and _replay.ACTIVE:  # in the order they ran
        _replay.note(np.matmul, (q, kt, scores))
        _replay.note(softmax_rows, (scores, scores, mask, scale, op))
        _replay.note(np.matmul, (scores, v, y))
    return noted


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
