"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear.

Granularity follows the scale's shape: a scalar is per tensor, a 1-D scale is per ``axis``,
and a scale of the input's rank is blocked along ``axis`` by ``block_size``. Integer targets
round half to even and saturate to the type's range; float8 targets saturate to the largest
finite value when ``saturate=1`` and overflow to Inf/NaN (ml_dtypes' cast) when 0.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from anychip.backends.cpu.kernels._common import normalize_axis
from anychip.backends.cpu.native import qlinear
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError
from anychip.ir.dtypes import DType

__all__ = ["quantize_linear", "dequantize_linear", "dynamic_quantize_linear"]

_INT_RANGES = {
    DType.UINT8: (0, 255),
    DType.INT8: (-128, 127),
    DType.UINT16: (0, 65535),
    DType.INT16: (-32768, 32767),
    DType.UINT4: (0, 15),
    DType.INT4: (-8, 7),
    DType.UINT2: (0, 3),
    DType.INT2: (-2, 1),
}


def _broadcast_param(
    p: np.ndarray, x: np.ndarray, axis: int, block_size: int, what: str
) -> np.ndarray:
    """``p`` (scale or zero point) expanded to broadcast against ``x``."""
    p = np.asarray(p)
    if p.size == 1 and (p.ndim <= 1 or block_size == 0):
        return p.reshape(())
    ax = normalize_axis(axis, x.ndim, what)
    if p.ndim == 1 and block_size == 0:
        if p.shape[0] != x.shape[ax]:
            raise ModelError(
                f"{what}: per-axis scale has {p.shape[0]} values but axis {ax} of "
                f"the input has {x.shape[ax]}"
            )
        shape = [1] * x.ndim
        shape[ax] = -1
        return p.reshape(shape)
    if p.ndim != x.ndim or block_size <= 0:
        raise ModelError(
            f"{what}: scale of shape {p.shape} fits neither per-tensor, per-axis "
            f"nor blocked quantization of an input {x.shape} (block_size="
            f"{block_size})"
        )
    full = np.repeat(p, block_size, axis=ax)
    return np.take(full, np.arange(x.shape[ax]), axis=ax)


def _to_float(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) if a.dtype == np.float64 else a.astype(np.float32)


def _saturate_float(v: np.ndarray, target: np.dtype, saturate: int) -> np.ndarray:
    info = ml_dtypes.finfo(target)
    if saturate or DType.from_numpy(target) is DType.FLOAT4E2M1:
        v = np.where(np.isnan(v), v, np.clip(v, -float(info.max), float(info.max)))
    return v.astype(target)


@kernel("QuantizeLinear", since=10)
def quantize_linear(
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    precision: int = 0,
    saturate: int = 1,
) -> np.ndarray:
    if output_dtype:
        out = DType(output_dtype)
        if y_zero_point is not None and DType.from_numpy(y_zero_point.dtype) is not out:
            raise ModelError(
                f"QuantizeLinear: output_dtype {out.name} differs from the zero "
                f"point's type {DType.from_numpy(y_zero_point.dtype).name}"
            )
    elif y_zero_point is not None:
        out = DType.from_numpy(y_zero_point.dtype)
    else:
        out = DType.UINT8
    per_tensor = y_scale.size == 1 and not block_size
    given = np.dtype(np.uint8) if y_zero_point is None else y_zero_point.dtype
    if not precision and (out is DType.UINT8 or out is DType.INT8) and per_tensor:
        # per tensor in C, the same steps (noted for a replay: the node's whole effect)
        q8 = qlinear.quantize(x, y_scale, y_zero_point, seal=True) if given == out.numpy else None
        if q8 is not None:
            return q8
    scale = _broadcast_param(y_scale, x, axis, block_size, "QuantizeLinear")
    # The division runs in the precision type (default: the scale's type).
    prec = DType(precision).numpy if precision else scale.dtype
    if DType.from_numpy(prec) is DType.FLOAT8E8M0:
        prec = np.dtype(np.float32)
    work = np.float64 if prec == np.float64 or x.dtype.kind in "iu" else np.float32
    # One new array, then in place: the same operations in the same order as
    # ``clip(rint(x / s) + zp)`` (a 16M-element tensor made seven before: 45 ms of 90).
    q = np.divide(x, scale.astype(work), dtype=work)
    if prec.itemsize < 4 and prec.kind != "i":
        q = q.astype(prec).astype(work)
    zp = (
        np.zeros((), dtype=work)
        if y_zero_point is None
        else _to_float(_broadcast_param(y_zero_point, x, axis, block_size, "QuantizeLinear"))
    )
    if out in _INT_RANGES:
        lo, hi = _INT_RANGES[out]
        np.rint(q, out=q)
        if zp.ndim == 0 or zp.shape == q.shape:
            np.add(q, zp, out=q, casting="unsafe")
        else:
            q = q + zp
        np.clip(q, lo, hi, out=q)
        return q.astype(out.numpy)
    if out.is_float:
        return _saturate_float(q + zp, out.numpy, saturate)
    raise ModelError(
        f"QuantizeLinear: cannot quantize to {out.name}; use an 8/16/4/2-bit "
        "integer or a float8/float4 type"
    )


@kernel("DequantizeLinear", since=10)
def dequantize_linear(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
) -> np.ndarray:
    out = DType(output_dtype).numpy if output_dtype else x_scale.dtype
    if DType.from_numpy(out) is DType.FLOAT8E8M0:
        out = np.dtype(np.float32)
    if out == np.float32 and x_scale.size == 1 and not block_size:
        v = qlinear.dequantize(x, x_scale, x_zero_point, seal=True)  # per tensor in C
        if v is not None:
            return v
    scale = _broadcast_param(x_scale, x, axis, block_size, "DequantizeLinear")
    work = np.float64 if x.dtype.kind in "iu" and x.dtype.itemsize >= 4 else np.float32
    v = x.astype(work)  # one new array, the rest in place where the shapes allow
    if x_zero_point is not None:
        zp = _broadcast_param(x_zero_point, x, axis, block_size, "DequantizeLinear").astype(work)
        v = np.subtract(v, zp, out=v) if np.broadcast(v, zp).shape == v.shape else v - zp
    s = scale.astype(work)
    v = np.multiply(v, s, out=v) if np.broadcast(v, s).shape == v.shape else v * s
    return v if v.dtype == out else v.astype(out)


@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scale and zero point computed in float32, as the spec's formula, onnx's reference and
    onnxruntime do (in float64 a few elements land one step apart)."""
    done = qlinear.dynamic_quantize(x, seal=True)  # in C, the same float32 steps
    if done is not None:
        return done
    f32 = np.float32
    xf = x.astype(f32)
    lo = np.minimum(f32(0), xf.min()) if xf.size else f32(0)
    hi = np.maximum(f32(0), xf.max()) if xf.size else f32(0)
    scale = f32(hi - lo) / f32(255)
    if scale == 0:
        # All zeros: any scale reproduces them; zero point 0 keeps y exact.
        return (np.zeros(x.shape, np.uint8), np.array(scale, f32), np.array(0, np.uint8))
    zp = np.rint(np.clip(f32(0) - lo / scale, f32(0), f32(255)))
    y = np.clip(np.rint(xf / scale) + zp, 0, 255).astype(np.uint8)
    return y, np.array(scale, f32), np.array(zp, np.uint8)
