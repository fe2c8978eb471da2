"""Tensor element types: every ONNX ``TensorProto.DataType``, mapped to numpy.

Invariants:
    * ``DType`` values equal ONNX's ``TensorProto`` enum values, so conversion is ``DType(int)``.
    * ``DType.numpy`` is the numpy dtype that holds the values on the host. bfloat16, the
      float8 and the 4-bit families come from ``ml_dtypes`` (the same types onnx and JAX use),
      imported the first time one of them is asked for (it takes half a second to import).
    * ``DType.STRING`` is held as ``numpy.object_`` arrays of ``str``.
"""

from __future__ import annotations

import enum
import threading

import numpy as np

__all__ = [
    "DType",
    "FLOAT_TYPES",
    "INT_TYPES",
    "NUMERIC_TYPES",
    "STANDARD_NUMERIC_TYPES",
    "ALL_TYPES",
]


class DType(enum.IntEnum):
    """An ONNX tensor element type."""

    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype that holds this type on the host."""
        found = _TO_NUMPY.get(self)
        if found is None:
            _add_ml_dtypes()
            found = _TO_NUMPY.get(self)
        if found is None:
            from anychip.errors import UnsupportedDTypeError

            raise UnsupportedDTypeError(
                f"tensor type {self.name} has no numpy representation in this build; "
                "upgrade ml_dtypes or avoid this type"
            )
        return found

    @property
    def itemsize(self) -> float:
        """Bytes per element (0.5 for the 4-bit types, 0.25 for 2-bit)."""
        if self in (DType.UINT4, DType.INT4, DType.FLOAT4E2M1):
            return 0.5
        if self in (DType.UINT2, DType.INT2):
            return 0.25
        if self is DType.STRING:
            return 8
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self in FLOAT_TYPES

    @property
    def is_integer(self) -> bool:
        return self in INT_TYPES

    @property
    def short(self) -> str:
        """A short lower-case name for printing, e.g. ``f32``, ``i64``, ``bf16``."""
        return _SHORT.get(self, self.name.lower())

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> DType:
        """The DType of a numpy dtype; raises UnsupportedDTypeError for unknown ones."""
        dt = np.dtype(dtype)
        found = _FROM_NUMPY.get(dt)
        if found is not None:
            return found
        if dt.kind in ("U", "S", "O"):
            return cls.STRING
        _add_ml_dtypes()  # an ml_dtypes type (bfloat16...): its table is added on first need
        found = _FROM_NUMPY.get(dt)
        if found is not None:
            return found
        from anychip.errors import UnsupportedDTypeError

        raise UnsupportedDTypeError(f"numpy dtype {dt} has no ONNX tensor type")


def _numpy_types() -> dict[DType, np.dtype]:
    return {
        DType.FLOAT: np.dtype(np.float32),
        DType.UINT8: np.dtype(np.uint8),
        DType.INT8: np.dtype(np.int8),
        DType.UINT16: np.dtype(np.uint16),
        DType.INT16: np.dtype(np.int16),
        DType.INT32: np.dtype(np.int32),
        DType.INT64: np.dtype(np.int64),
        DType.STRING: np.dtype(object),
        DType.BOOL: np.dtype(np.bool_),
        DType.FLOAT16: np.dtype(np.float16),
        DType.DOUBLE: np.dtype(np.float64),
        DType.UINT32: np.dtype(np.uint32),
        DType.UINT64: np.dtype(np.uint64),
        DType.COMPLEX64: np.dtype(np.complex64),
        DType.COMPLEX128: np.dtype(np.complex128),
    }


def _ml_dtypes_types() -> dict[DType, np.dtype]:
    import ml_dtypes

    names = {
        DType.BFLOAT16: "bfloat16",
        DType.FLOAT8E4M3FN: "float8_e4m3fn",
        DType.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
        DType.FLOAT8E5M2: "float8_e5m2",
        DType.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
        DType.UINT4: "uint4",
        DType.INT4: "int4",
        # newer ml_dtypes only: without them these types have no numpy representation
        DType.FLOAT4E2M1: "float4_e2m1fn",
        DType.FLOAT8E8M0: "float8_e8m0fnu",
        DType.UINT2: "uint2",
        DType.INT2: "int2",
    }
    return {t: np.dtype(getattr(ml_dtypes, n)) for t, n in names.items() if hasattr(ml_dtypes, n)}


def _add_ml_dtypes() -> None:
    """Add ml_dtypes' types to the tables, once (later calls return at once)."""
    global _HAVE_ML_DTYPES, _TO_NUMPY, _FROM_NUMPY
    with _ML_LOCK:
        if _HAVE_ML_DTYPES:
            return
        extra = _ml_dtypes_types()
        # new dicts, swapped in whole: readers without the lock see the old or the new table
        _TO_NUMPY = {**_TO_NUMPY, **extra}
        _FROM_NUMPY = {**_FROM_NUMPY, **{v: k for k, v in extra.items()}}
        _HAVE_ML_DTYPES = True


_ML_LOCK = threading.Lock()
_HAVE_ML_DTYPES = False
_TO_NUMPY = _numpy_types()
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items() if k is not DType.STRING}
_SHORT = {
    DType.FLOAT: "f32",
    DType.DOUBLE: "f64",
    DType.FLOAT16: "f16",
    DType.BFLOAT16: "bf16",
    DType.INT64: "i64",
    DType.INT32: "i32",
    DType.INT16: "i16",
    DType.INT8: "i8",
    DType.UINT8: "u8",
    DType.UINT16: "u16",
    DType.UINT32: "u32",
    DType.UINT64: "u64",
    DType.BOOL: "bool",
    DType.STRING: "str",
}

FLOAT_TYPES = frozenset(
    {
        DType.FLOAT,
        DType.DOUBLE,
        DType.FLOAT16,
        DType.BFLOAT16,
        DType.FLOAT8E4M3FN,
        DType.FLOAT8E4M3FNUZ,
        DType.FLOAT8E5M2,
        DType.FLOAT8E5M2FNUZ,
        DType.FLOAT4E2M1,
        DType.FLOAT8E8M0,
    }
)
INT_TYPES = frozenset(
    {
        DType.UINT8,
        DType.INT8,
        DType.UINT16,
        DType.INT16,
        DType.INT32,
        DType.INT64,
        DType.UINT32,
        DType.UINT64,
        DType.UINT4,
        DType.INT4,
        DType.UINT2,
        DType.INT2,
    }
)
NUMERIC_TYPES = FLOAT_TYPES | INT_TYPES | {DType.COMPLEX64, DType.COMPLEX128}
ALL_TYPES = frozenset(DType) - {DType.UNDEFINED}
#: ONNX's usual numeric type constraint: the 8- to 64-bit integers, float16/32/64, bfloat16.
STANDARD_NUMERIC_TYPES = frozenset(
    {
        DType.FLOAT16,
        DType.FLOAT,
        DType.DOUBLE,
        DType.BFLOAT16,
        DType.INT8,
        DType.INT16,
        DType.INT32,
        DType.INT64,
        DType.UINT8,
        DType.UINT16,
        DType.UINT32,
        DType.UINT64,
    }
)
