"""Bit-level kernels: BitShift, BitwiseAnd/Or/Xor/Not, and BitCast (reinterpret the bits)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import UnsupportedDTypeError
from anychip.ir.dtypes import ALL_TYPES, DType

__all__ = [
    "bit_shift",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_not",
    "bit_cast",
]

_UNSIGNED = frozenset({DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64})
_SIGNED = frozenset({DType.INT8, DType.INT16, DType.INT32, DType.INT64})
_BITWISE = _UNSIGNED | _SIGNED


@kernel("BitShift", since=11, dtypes=_BITWISE)
def bit_shift(x: np.ndarray, y: np.ndarray, *, direction: str) -> np.ndarray:
    """Shift with the spec's out-of-range rule: a shift < 0 or >= the bit width yields the
    sign fill alone (-1 for a right shift of a negative signed value, else 0)."""
    bits = x.dtype.itemsize * 8
    y = np.asarray(y)
    in_range = (y >= 0) & (y < bits) if y.dtype.kind == "i" else y < bits
    # numpy's shifts are undefined past the bit width, so shift by a safe amount and patch.
    amount = np.where(in_range, y, 0).astype(x.dtype)
    if direction == "LEFT":
        shifted = np.left_shift(x, amount)
        fill = np.zeros((), dtype=x.dtype)
    elif direction == "RIGHT":
        shifted = np.right_shift(x, amount)  # arithmetic for signed numpy types
        fill = np.where(x < 0, -1, 0).astype(x.dtype) if x.dtype.kind == "i" else x.dtype.type(0)
    else:
        from anychip.errors import ModelError

        raise ModelError(f"BitShift direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return np.where(in_range, shifted, fill).astype(x.dtype, copy=False)


@kernel("BitwiseAnd", since=18, dtypes=_BITWISE)
def bitwise_and(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.bitwise_and(a, b)


@kernel("BitwiseOr", since=18, dtypes=_BITWISE)
def bitwise_or(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.bitwise_or(a, b)


@kernel("BitwiseXor", since=18, dtypes=_BITWISE)
def bitwise_xor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.bitwise_xor(a, b)


@kernel("BitwiseNot", since=18, dtypes=_BITWISE)
def bitwise_not(x: np.ndarray) -> np.ndarray:
    return np.invert(x)


_NIBBLE_TYPES = frozenset({DType.INT4, DType.UINT4, DType.FLOAT4E2M1})


def _bit_width(dt: DType) -> int:
    return int(dt.itemsize * 8)


@kernel("BitCast", since=26, dtypes=ALL_TYPES - {DType.STRING})
def bit_cast(x: np.ndarray, *, to: int) -> np.ndarray:
    """Reinterpret the bits of ``x`` as type ``to`` (same bit width, little endian)."""
    src = DType.from_numpy(x.dtype)
    dst = DType(to)
    if dst is DType.STRING or _bit_width(src) != _bit_width(dst):
        raise UnsupportedDTypeError(
            f"BitCast from {src.name} to {dst.name}: the target must be a non-string type of "
            f"the same bit width ({_bit_width(src)} bits); pick a matching 'to'"
        )
    target = dst.numpy
    if src in _NIBBLE_TYPES:
        # ml_dtypes keeps one 4-bit value per byte: reinterpret the low nibble only.
        nibble = np.ascontiguousarray(x).view(np.uint8) & np.uint8(0x0F)
        if dst is DType.INT4:
            return (
                np.where(nibble >= 8, nibble.astype(np.int8) - 16, nibble)
                .astype(np.int8)
                .astype(target)
            )
        return nibble.view(target)
    data = np.ascontiguousarray(x)
    if data.dtype.byteorder == ">":
        data = data.astype(data.dtype.newbyteorder("<"))
    return data.view(target).reshape(x.shape)
