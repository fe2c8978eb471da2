"""Host-side launcher of the XPU's attention kernel (``driver/kernels_attention.c``).

``xpu_attention(q, kt, v, mask, scale=, divide=)`` computes what ``anychip::FusedAttention``
means (``softmax(q @ kt (/ or *) scale [+ mask], last axis) @ v``). float32 operands of rank
>= 2 with equal batch dimensions and no mask run as one C launch that keeps each block's
scores in cache; anything else (a mask, broadcast batch dimensions, 1-D operands) runs as the
unfused nodes' own launches, MatMul, Mul or Div, Add, Softmax and MatMul, so the fused node
never fails where its parts would run.

Example:
    >>> import numpy as np
    >>> from anychip.backends.xpu_stub.driver import get_driver
    >>> rng = np.random.default_rng(0)
    >>> shapes = ([2, 3, 4], [2, 4, 5], [2, 5, 6])
    >>> q, kt, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    >>> d = [get_driver().upload(a) for a in (q, kt, v)]
    >>> y = xpu_attention(*d, scale=0.5)
    >>> y.shape
    (2, 3, 6)
    >>> for t in (*d, y):
    ...     t.free()
"""

from __future__ import annotations

import numpy as np

from anychip.backends.xpu_stub.driver import XpuTensor
from anychip.backends.xpu_stub.driver import launch as K
from anychip.backends.xpu_stub.driver._launch_util import (
    _FLOAT32,
    _dtype_code,
    _launch,
    _numel,
    _same_driver,
)
from anychip.errors import KernelError

__all__ = ["xpu_attention"]


def _fused_shapes(q: XpuTensor, kt: XpuTensor, v: XpuTensor) -> tuple[int, ...] | None:
    """``(batches, S, D, T, E)`` when the one-launch kernel applies, else None."""
    if min(q.ndim, kt.ndim, v.ndim) < 2 or not q.ndim == kt.ndim == v.ndim:
        return None
    if not q.shape[:-2] == kt.shape[:-2] == v.shape[:-2]:
        return None
    (s, d), (d2, t), (t2, e) = q.shape[-2:], kt.shape[-2:], v.shape[-2:]
    if d != d2 or t != t2:
        raise KernelError(
            f"FusedAttention: q {q.shape}, kt {kt.shape} and v {v.shape} do not chain "
            "(q's last axis must match kt's second last, kt's last v's second last)"
        )
    return _numel(q.shape[:-2]), s, d, t, e


def _composed(
    q: XpuTensor, kt: XpuTensor, v: XpuTensor, mask: XpuTensor | None, scale: float, divide: int
) -> XpuTensor:
    """The unfused nodes' launches, each intermediate freed after its reader is queued."""
    c = q.driver.upload(np.array(scale, np.float32))
    steps = []
    try:
        steps.append(K.xpu_matmul(q, kt))
        steps.append(K.xpu_binary("Div" if divide else "Mul", steps[-1], c))
        if mask is not None:
            steps.append(K.xpu_add(steps[-1], mask))
        steps.append(K.xpu_softmax(steps[-1], -1))
        return K.xpu_matmul(steps[-1], v)
    finally:
        for t in (c, *steps):
            t.free()  # drains the queue first, so the launches have read them


def xpu_attention(
    q: XpuTensor,
    kt: XpuTensor,
    v: XpuTensor,
    mask: XpuTensor | None = None,
    *,
    scale: float,
    divide: int = 1,
) -> XpuTensor:
    """``softmax(q @ kt / scale [+ mask]) @ v`` (``* scale`` when ``divide`` is 0), along the
    last axis; see the module docstring for when it is one launch."""
    driver = _same_driver("FusedAttention", [t for t in (q, kt, v, mask) if t is not None])
    for t in (q, kt, v, mask):
        if t is not None:
            _dtype_code("FusedAttention", t.dtype, allow_int64=False)
    dims = _fused_shapes(q, kt, v) if mask is None else None
    if dims is None:
        return _composed(q, kt, v, mask, scale, divide)
    out = driver.empty((*q.shape[:-1], v.shape[-1]), _FLOAT32)
    iargs = [*dims, int(bool(divide))]
    return _launch("FusedAttention", "Attention", out, [q, kt, v], iargs, [float(scale)])
