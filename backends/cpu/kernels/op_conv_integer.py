"""Integer convolutions and matmuls: ConvInteger, MatMulInteger, QLinearConv, QLinearMatMul.

The integer products are computed exactly in float64 (8-bit products summed over any
realistic reduction stay far below 2**53) by the float Conv kernel and numpy's matmul. The
matmuls run in float32 (BLAS sgemm, about twice dgemm's speed) when a bound shows the result
exact: every partial sum is an integer, and when ``max_i sum_k |a_ik| * max |b|`` (or the
same with the roles swapped) is below 2**24 every one of them is a float32 integer, so no
addition rounds whatever order BLAS adds in. The convolutions stay in float64: the float Conv
kernel may change algorithm (Winograd, FFT) and then float32 is not exact.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._ml_common import compiled
from anychip.backends.cpu.kernels.op_conv import conv
from anychip.backends.cpu.table import kernel
from anychip.core.kernel_call import KernelContext
from anychip.errors import ModelError

__all__ = ["conv_integer", "mat_mul_integer", "qlinear_conv", "qlinear_mat_mul"]


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


def _conv_f64(x: np.ndarray, w: np.ndarray, attrs: dict) -> np.ndarray:
    return conv(x, w, None, **attrs)


@kernel("ConvInteger", since=10)
def conv_integer(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    **attrs: object,
) -> np.ndarray:
    y = _conv_f64(_centered(x, x_zero_point), _centered(w, w_zero_point, 0), attrs)
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


_EXACT_F32 = float(2**24)


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


@kernel("MatMulInteger", since=10)
def mat_mul_integer(
    a: np.ndarray,
    b: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    y = _exact_matmul(_matmul_zp(a, a_zero_point, False), _matmul_zp(b, b_zero_point, True))
    return np.rint(y).astype(np.int32)


def _requantize(y: np.ndarray, y_scale: np.ndarray, y_zero_point: np.ndarray) -> np.ndarray:
    scale = np.asarray(y_scale).astype(np.float64)
    zp = np.asarray(y_zero_point)
    q = np.rint(y / scale.reshape(())) + zp.astype(np.float64).reshape(())
    info = np.iinfo(zp.dtype)
    return np.clip(q, info.min, info.max).astype(zp.dtype)


def _scale_of(scale: np.ndarray, ndim: int, axis: int | None) -> np.ndarray:
    s = np.asarray(scale).astype(np.float64)
    if s.size == 1 or axis is None:
        return s.reshape(()) if s.size == 1 else s
    shape = [1] * ndim
    shape[axis] = -1
    return s.reshape(shape)


def _weights_centered(ctx: KernelContext, w: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    """``w - w_zero_point`` in float64, kept per node while the same weight array comes back
    (an initializer: converting it on every run cost as much as the small convolutions)."""
    cache: dict = compiled(ctx, dict)
    hit = cache.get("w")
    if hit is not None and hit[0] is w and hit[1] is zp:
        return hit[2]
    centered = _centered(w, zp, 0)
    cache["w"] = (w, zp, centered)
    return centered


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
    acc = _conv_f64(_centered(x, x_zero_point), _weights_centered(ctx, w, w_zero_point), attrs)
    if b is not None:
        acc = acc + b.astype(np.float64).reshape((1, -1) + (1,) * (acc.ndim - 2))
    real = acc * _scale_of(x_scale, acc.ndim, None) * _scale_of(w_scale, acc.ndim, 1)
    return _requantize(real, y_scale, y_zero_point)


@kernel("QLinearMatMul", since=10)
def qlinear_mat_mul(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
) -> np.ndarray:
    acc = _exact_matmul(_matmul_zp(a, a_zero_point, False), _matmul_zp(b, b_zero_point, True))
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
