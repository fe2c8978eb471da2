"""Integer convolutions and matmuls: ConvInteger, MatMulInteger, QLinearConv, QLinearMatMul.

The integer products are computed exactly in float64 (8-bit products summed over any
realistic reduction stay far below 2**53) by the float Conv kernel and numpy's matmul. The
matmuls run in float32 (BLAS sgemm, about twice dgemm's speed) when a bound shows the result
exact: every partial sum is an integer, and when ``max_i sum_k |a_ik| * max |b|`` (or the
same with the roles swapped) is below 2**24 every one of them is a float32 integer, so no
addition rounds whatever order BLAS adds in. The convolutions run the same way through
oneDNN's float32 direct convolution (never Winograd) when the bound ``max |x - x_zp| *
max_m sum |w_m - w_zp|`` (the first factor from x's type range, the second kept per node) is
below 2**24 (numpy's float32 Conv kernel, im2col and sgemm, below oneDNN's ``MIN_MACS``
multiply-adds, where its call costs less), else in float64 through the numpy Conv kernel.
oneDNN's int8 convolution is not used: without VNNI its u8s8 products pass through
saturating 16-bit pairs (the saturation onnxruntime's u8s8 GEMM shows), so it is not exact
on every x86 machine.
"""

from __future__ import annotations

import math

import numpy as np

from anychip.backends.cpu.kernels._ml_common import compiled
from anychip.backends.cpu.kernels._qproduct import product_of, run_product
from anychip.backends.cpu.kernels.op_conv import conv
from anychip.backends.cpu.native.qlinear import Product, centered
from anychip.backends.cpu.onednn import conv as onednn_conv
from anychip.backends.cpu.onednn import int8 as onednn_int8
from anychip.backends.cpu.onednn import matmul as onednn_matmul
from anychip.backends.cpu.replay import record as _replay
from anychip.backends.cpu.table import kernel
from anychip.core.run.kernel_call import KernelContext
from anychip.errors import ModelError

__all__ = [
    "conv_integer",
    "mat_mul_integer",
    "qlinear_conv",
    "qlinear_mat_mul",
    "qlinear_product",
]


def _centered(
    v: np.ndarray, zero_point: np.ndarray | None, channel_axis: int | None = None
) -> np.ndarray:
    """``v - zero_point`` in float64; a 1-D zero point is per output channel / column."""
    out = v.astype(np.float64)
    if zero_point is None:
        return out
    zp = np.asarray(zero_point).astype(np.float64)
    if zp.size == 1:
        return out - zp.reshape(())
    if channel_axis is None:
        raise ModelError("a per-channel zero point is only allowed for the weight input")
    shape = [1] * v.ndim
    shape[channel_axis] = -1
    return out - zp.reshape(shape)


_EXACT_F32 = float(2**24)


def _conv_f64(x: np.ndarray, w: np.ndarray, attrs: dict) -> np.ndarray:
    return conv(x, w, None, **attrs)


class _Weights:
    """``w - w_zero_point`` in float64 and float32, and the largest per-output-channel L1 norm
    (the weight factor of the exactness bound)."""

    __slots__ = ("w", "zp", "f64", "f32", "l1")

    def __init__(self, w: np.ndarray, zp: np.ndarray | None) -> None:
        self.w, self.zp = w, zp
        self.f64 = _centered(w, zp, 0)
        self.f32 = self.f64.astype(np.float32)
        m = self.f64.shape[0] if self.f64.ndim else 1
        self.l1 = float(np.abs(self.f64).reshape(m, -1).sum(axis=1).max()) if self.f64.size else 0.0


def _x_bound(x: np.ndarray, zp: np.ndarray | None) -> float:
    """``max |x - zp|`` over x's whole type range (no pass over the data)."""
    if x.dtype.kind not in "iu":
        return float("inf")
    info = np.iinfo(x.dtype)
    z = 0.0 if zp is None else float(np.asarray(zp).reshape(-1)[0])
    return max(abs(info.min - z), abs(info.max - z))


def _integer_conv(x: np.ndarray, x_zp: np.ndarray | None, wt: _Weights, attrs: dict) -> np.ndarray:
    """The exact integer convolution of ``x - x_zp`` with the centered weights, float64."""
    if x_zp is not None and np.asarray(x_zp).size != 1:
        raise ModelError("the zero point of a convolution's input must be a scalar")
    if _x_bound(x, x_zp) * wt.l1 < _EXACT_F32 and x.ndim == wt.f32.ndim:
        xc = x.astype(np.float32)
        if x_zp is not None:
            xc -= np.float32(np.asarray(x_zp).reshape(-1)[0])
        strides = attrs.get("strides") or [1]
        macs = x.shape[0] * math.prod(x.shape[2:]) * wt.f32.size // math.prod(strides)
        y = None
        if macs >= onednn_matmul.MIN_MACS:  # below: oneDNN's call costs more than numpy's
            y = onednn_conv.conv(xc, wt.f32, None, None, None, attrs)
        if y is None:
            y = conv(xc, wt.f32, None, **attrs)
        _replay.unseal()  # the convolution may have sealed its call; the callers do more
        return y.astype(np.float64)
    return _conv_f64(_centered(x, x_zp), wt.f64, attrs)


def _weights(ctx: KernelContext | None, w: np.ndarray, zp: np.ndarray | None) -> _Weights:
    """The node's ``_Weights``, kept while the same weight array comes back (an initializer:
    converting it on every run cost as much as the small convolutions)."""
    if ctx is None:
        return _Weights(w, zp)
    cache: dict = compiled(ctx, dict)
    hit = cache.get("w")
    if hit is not None and hit.w is w and hit.zp is zp:
        return hit
    cache["w"] = hit = _Weights(w, zp)
    return hit


@kernel("ConvInteger", since=10, context=True)
def conv_integer(
    ctx: KernelContext,
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    **attrs: object,
) -> np.ndarray:
    y = _integer_conv(x, x_zero_point, _weights(ctx, w, w_zero_point), attrs)
    return np.rint(y).astype(np.int32)


def _matmul_zp(v: np.ndarray, zp: np.ndarray | None, is_b: bool) -> np.ndarray:
    out = v.astype(np.float64)
    if zp is None:
        return out
    z = np.asarray(zp).astype(np.float64)
    if z.size == 1:
        return out - z.reshape(())
    if is_b:
        # Per output column: shape [N] or [..., 1, N].
        return out - z.reshape(z.shape[:-1] + (1, z.shape[-1]) if z.ndim > 1 else (1, -1))
    # Per row of A: shape [M] or [..., M, 1].
    return out - (z.reshape(-1, 1) if z.ndim == 1 else z)


def _exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` of integer-valued float64 arrays, exactly, in float32 where provably exact."""
    if a.size and b.size and a.ndim >= 2 and b.ndim >= 2:
        abs_a, abs_b = np.abs(a), np.abs(b)
        bound = min(
            float(abs_a.sum(axis=-1).max()) * float(abs_b.max()),
            float(abs_b.sum(axis=-2).max()) * float(abs_a.max()),
        )
        if bound < _EXACT_F32:
            return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float64)
    return np.matmul(a, b)


def _integer_matmul(
    a: np.ndarray, b: np.ndarray, a_zp: np.ndarray | None, b_zp: np.ndarray | None
) -> np.ndarray:
    """``(a - a_zp) @ (b - b_zp)`` exactly: oneDNN's int8 product where it is exact here
    (``onednn/int8.py``: VNNI or AMX; int32), else float32/float64 (``_exact_matmul``;
    integer-valued float64)."""
    y = onednn_int8.int_matmul(a, b, a_zp, b_zp)
    if y is not None:
        return y
    return _exact_matmul(_matmul_zp(a, a_zp, False), _matmul_zp(b, b_zp, True))


@kernel("MatMulInteger", since=10, context=True)
def mat_mul_integer(
    ctx: KernelContext | None,
    a: np.ndarray,
    b: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    if b.ndim == 2 and b.dtype.itemsize == 1:  # the whole product in one C call (_qproduct)
        prod = product_of(
            ctx, (1, 3), (b, b_zero_point),
            lambda: Product(centered(b, b_zero_point), b.shape[1], 0),
        )  # fmt: skip
        y = run_product(prod, a, a_zero_point, b, b_zero_point, seal=True)
        if y is not None:
            return y
    y = _integer_matmul(a, b, a_zero_point, b_zero_point)
    return y if y.dtype == np.int32 else np.rint(y).astype(np.int32)


def _scale_of(scale: np.ndarray, ndim: int, axis: int | None) -> np.ndarray:
    s = np.asarray(scale).astype(np.float64)
    if s.size == 1 or axis is None:
        return s.reshape(()) if s.size == 1 else s
    shape = [1] * ndim
    shape[axis] = -1
    return s.reshape(shape)


@kernel("QLinearConv", since=10, context=True)
def qlinear_conv(
    ctx: KernelContext,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    w: np.ndarray,
    w_scale: np.ndarray,
    w_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    b: np.ndarray | None = None,
    **attrs: object,
) -> np.ndarray:
    acc = _integer_conv(x, x_zero_point, _weights(ctx, w, w_zero_point), attrs)
    # In place on the fresh accumulator (each temporary cost a few us on small maps), the
    # same operations in the same order as before: ((acc + b) * xs) * ws / ys, rint, + zp.
    if b is not None:
        acc += b.astype(np.float64).reshape((1, -1) + (1,) * (acc.ndim - 2))
    acc *= _scale_of(x_scale, acc.ndim, None)
    acc *= _scale_of(w_scale, acc.ndim, 1)
    acc /= np.asarray(y_scale).astype(np.float64).reshape(())
    np.rint(acc, out=acc)
    zp = np.asarray(y_zero_point)
    acc += zp.astype(np.float64).reshape(())
    info = np.iinfo(zp.dtype)
    np.clip(acc, info.min, info.max, out=acc)
    return acc.astype(zp.dtype)


def qlinear_product(
    b: np.ndarray, a_scale: np.ndarray, b_scale: np.ndarray, b_zero_point: np.ndarray,
    y_scale: np.ndarray, y_zero_point: np.ndarray, then_add: tuple | None = None,
) -> Product | None:  # fmt: skip
    """QLinearMatMul's ``Product``: the scale per column as ``qlinear_mat_mul`` rounds it
    (``f32(f64(sa) * f64(sb))``), divided by ``y_scale`` in float64; None for forms the C
    does not take (per-row ``a_scale``, batched ``b``, an output zero point not 8-bit)."""
    n = b.shape[1]
    sb = np.asarray(b_scale).astype(np.float64).reshape(-1)
    if np.asarray(a_scale).size != 1 or sb.size not in (1, n) or np.asarray(y_scale).size != 1:
        return None
    zp = np.asarray(y_zero_point)
    if zp.size != 1 or zp.dtype.itemsize != 1 or zp.dtype.kind not in "iu":
        return None
    sa = float(np.asarray(a_scale).astype(np.float64).reshape(()))
    ys = float(np.asarray(y_scale).astype(np.float64).reshape(()))
    scale = (sa * sb).astype(np.float32)
    bc = centered(b, b_zero_point)
    return Product(bc, n, 3, scale=scale, ys=ys, yzp=zp, out_dtype=zp.dtype, then_add=then_add)


@kernel("QLinearMatMul", since=10, context=True)
def qlinear_mat_mul(
    ctx: KernelContext | None,
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
) -> np.ndarray:
    if b.ndim == 2 and b.dtype.itemsize == 1:  # the whole requantization in C (_qproduct)
        arrays = (b, a_scale, b_scale, b_zero_point, y_scale, y_zero_point)
        prod = product_of(ctx, (1, 3, 4, 5, 6, 7), arrays, lambda: qlinear_product(*arrays))
        zps = (a_zero_point, b, b_zero_point)
        y = None if prod is None else run_product(prod, a, *zps, seal=True)
        if y is not None:
            return y
    acc = _integer_matmul(a, b, a_zero_point, b_zero_point).astype(np.float64)
    sa = np.asarray(a_scale).astype(np.float64)
    sb = np.asarray(b_scale).astype(np.float64)
    sa = sa.reshape(()) if sa.size == 1 else sa.reshape(-1, 1)
    sb = sb.reshape(()) if sb.size == 1 else sb.reshape(sb.shape[:-1] + (1, sb.shape[-1]))
    # Scales in float32 products, as a float32 runtime would multiply them.
    real = acc * (sa * sb).astype(np.float32).astype(np.float64)
    zp = np.asarray(y_zero_point)
    ys = np.asarray(y_scale).astype(np.float64).reshape(())
    q = np.rint(real / ys) + zp.astype(np.float64).reshape(())
    if zp.dtype.kind in "iu":
        info = np.iinfo(zp.dtype)
        return np.clip(q, info.min, info.max).astype(zp.dtype)
    return q.astype(zp.dtype)
