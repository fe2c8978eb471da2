"""numpy arrays <-> onnxruntime ``OrtValue``s in host memory, every ONNX element type.

onnxruntime's Python binding converts the numpy types it knows (floats, ints, bool, strings);
bfloat16, the float8s and the 4- and 2-bit types (``ml_dtypes`` arrays on anychip's side) it
cannot, and it packs the sub-byte types two or four to a byte where ``ml_dtypes`` keeps one
per byte. Those go through raw bytes here: an ``OrtValue`` of the ONNX type is allocated and
its buffer written or read with ``ctypes`` (host memory only), packing and unpacking the
sub-byte codes, first element in the low bits (ONNX's layout).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from anychip.ir.dtypes import DType

__all__ = ["EXOTIC", "is_exotic", "to_ort_value", "to_numpy"]

#: ONNX types onnxruntime's numpy conversion does not take, with their bits per element.
EXOTIC = {
    DType.BFLOAT16: 16,
    DType.FLOAT8E4M3FN: 8,
    DType.FLOAT8E4M3FNUZ: 8,
    DType.FLOAT8E5M2: 8,
    DType.FLOAT8E5M2FNUZ: 8,
    DType.FLOAT8E8M0: 8,
    DType.UINT4: 4,
    DType.INT4: 4,
    DType.FLOAT4E2M1: 4,
    DType.UINT2: 2,
    DType.INT2: 2,
}


def is_exotic(dtype: DType | int | None) -> bool:
    """Whether values of this ONNX type must go through ``to_ort_value`` / ``to_numpy``."""
    return dtype is not None and int(dtype) in {int(d) for d in EXOTIC}


def _onnx_type(array: np.ndarray) -> DType | None:
    try:
        return DType.from_numpy(array.dtype)
    except Exception:  # no ONNX type: onnxruntime's own conversion says why
        return None


def to_ort_value(array: np.ndarray) -> Any:
    """A host ``OrtValue`` holding a copy of ``array`` (any ONNX element type)."""
    import onnxruntime

    dtype = _onnx_type(array)
    if dtype is None or dtype not in EXOTIC:
        return onnxruntime.OrtValue.ortvalue_from_numpy(np.require(array, None, "C"))
    value = onnxruntime.OrtValue.ortvalue_from_shape_and_type(
        list(array.shape), int(dtype), "cpu", 0
    )
    data = _pack(np.ascontiguousarray(array).view(np.uint8).reshape(-1), EXOTIC[dtype])
    nbytes = value.tensor_size_in_bytes()
    if data.nbytes != nbytes:
        raise ValueError(f"{dtype.name}{list(array.shape)}: {data.nbytes} bytes for {nbytes}")
    if nbytes:
        ctypes.memmove(value.data_ptr(), data.ctypes.data, nbytes)
    return value


def to_numpy(value: Any) -> np.ndarray:
    """A host ``OrtValue`` as a numpy array of anychip's type for it (a copy)."""
    dtype = DType(value.element_type())
    if dtype not in EXOTIC:
        return value.numpy()
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = value.tensor_size_in_bytes()
    raw = np.frombuffer(ctypes.string_at(value.data_ptr(), nbytes), np.uint8) if nbytes else None
    codes = np.zeros(0, np.uint8) if raw is None else _unpack(raw, EXOTIC[dtype], count)
    return codes.view(dtype.numpy).reshape(shape).copy()


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Byte codes (one element per byte, or several bytes per element) packed ONNX's way."""
    if bits >= 8:
        return codes
    per = 8 // bits
    mask = (1 << bits) - 1
    pad = (-len(codes)) % per
    c = np.concatenate([codes & mask, np.zeros(pad, np.uint8)]).reshape(-1, per)
    out = np.zeros(len(c), np.uint8)
    for i in range(per):
        out |= (c[:, i] << (i * bits)).astype(np.uint8)
    return out


def _unpack(raw: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The inverse of ``_pack``: ``count`` codes, one per byte, from packed bytes."""
    if bits >= 8:
        return raw
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = [(raw >> (i * bits)) & mask for i in range(per)]
    return np.stack(parts, axis=1).reshape(-1)[:count].astype(np.uint8)
