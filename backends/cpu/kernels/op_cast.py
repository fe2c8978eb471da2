"""Cast and CastLike, across every ONNX tensor type (bfloat16, float8, 4/2-bit via ml_dtypes).

Opset 19 adds ``saturate``: casting to a float8 type clamps out-of-range values (and
infinities) to the largest finite value instead of producing NaN/inf. Opset 24 adds
``round_mode`` for float8e8m0. Strings parse to numbers and numbers print to strings.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError, UnsupportedDTypeError
from anychip.ir.dtypes import DType

__all__ = ["cast", "cast_like", "cast_array"]

_FLOAT8 = {DType.FLOAT8E4M3FN, DType.FLOAT8E4M3FNUZ, DType.FLOAT8E5M2, DType.FLOAT8E5M2FNUZ}


def _to_string(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(-1)
    if x.dtype.kind == "f" or x.dtype.kind == "V" or x.dtype.kind not in "biuO":
        out = [_float_str(float(v)) for v in flat.astype(np.float64)]
    elif x.dtype.kind == "b":
        # '1'/'0' as onnxruntime writes them: the spec casts bool to numbers as {1, 0} and
        # reads only numeric strings back, so a bool -> string -> float round trip holds
        # (onnx's reference evaluator writes 'True'/'False', which no Cast reads back).
        out = ["1" if v else "0" for v in flat.tolist()]
    else:
        out = [str(v) for v in flat.tolist()]
    return np.array(out, dtype=object).reshape(x.shape)


def _float_str(v: float) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "INF" if v > 0 else "-INF"
    return repr(np.float32(v).item()) if np.float32(v) == v else repr(v)


def _from_string(x: np.ndarray, target: np.dtype) -> np.ndarray:
    flat = [str(v) for v in x.reshape(-1)]
    if target.kind in "iu":
        vals = np.array(
            [int(float(s)) if "." in s or "e" in s.lower() else int(s) for s in flat],
            dtype=np.int64,
        )
    elif target.kind == "b":
        vals = np.array([s.lower() not in ("0", "false", "") for s in flat], dtype=np.bool_)
    else:
        vals = np.array([float(s) for s in flat], dtype=np.float64)
    return vals.astype(target).reshape(x.shape)


def _e8m0(x: np.ndarray, saturate: int, round_mode: str) -> np.ndarray:
    """float8e8m0 (a bare power-of-two exponent) with the requested rounding."""
    f = x.astype(np.float32)
    bits = f.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int64)
    mant = (bits & 0x7FFFFF).astype(np.int64)
    if round_mode == "up":
        exp = exp + (mant != 0)
    elif round_mode == "nearest":
        exp = exp + (mant >= 0x400000)
    elif round_mode != "down":
        raise KernelError(f"Cast: round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    nan = np.isnan(f) | (f <= 0) & ~(f == 0)
    inf = np.isinf(f) & (f > 0)
    if saturate:
        exp = np.clip(exp, 0, 254)
        exp = np.where(inf, 254, exp)
    else:
        exp = np.where((exp > 254) | inf, 255, exp)
    exp = np.where(nan | np.isnan(f), 255, exp)
    return exp.astype(np.uint8).view(DType.FLOAT8E8M0.numpy)


def cast_array(x: np.ndarray, to: DType, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    """``x`` converted to the ONNX type ``to``."""
    try:
        target = to.numpy
    except UnsupportedDTypeError as e:
        raise KernelError(f"Cast: {e}") from None
    if to == DType.STRING:
        return x.copy() if x.dtype == object else _to_string(x)
    if x.dtype == object:
        return _from_string(x, target)
    if x.dtype == target:
        return x.copy()
    if to == DType.FLOAT8E8M0:
        return _e8m0(x, saturate, round_mode)
    if to in _FLOAT8 and saturate and x.dtype.kind != "b":
        wide = x.astype(np.float32)
        big = float(ml_dtypes.finfo(target).max)
        # NaN passes np.clip unchanged; infinities clamp to the largest finite value.
        return np.clip(wide, -big, big).astype(target)
    if to == DType.BOOL:
        return x != 0
    with np.errstate(invalid="ignore", over="ignore"):
        if x.dtype.kind not in "fiub" and target.kind in "iu":
            return x.astype(np.float32).astype(target)
        return x.astype(target)


@kernel("Cast", since=1)
def cast(
    x: np.ndarray, *, to: int | str | None = None, saturate: int = 1, round_mode: str = "up"
) -> np.ndarray:
    """``x`` as type ``to`` (opset 1 spells ``to`` as a type name string)."""
    if to is None:
        raise KernelError("Cast: the 'to' attribute is required")
    if isinstance(to, str):
        try:
            to = DType[to.upper()]
        except KeyError:
            raise KernelError(f"Cast: unknown type name {to!r}") from None
    return cast_array(x, DType(to), saturate, round_mode)


@kernel("CastLike", since=15)
def cast_like(
    x: np.ndarray, target_type: np.ndarray, *, saturate: int = 1, round_mode: str = "up"
) -> np.ndarray:
    """``x`` as the element type of ``target_type``."""
    return cast_array(x, DType.from_numpy(target_type.dtype), saturate, round_mode)
