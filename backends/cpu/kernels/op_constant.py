"""Constant (one of its value attributes) and ConstantOfShape (a filled tensor)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from anychip.backends.cpu.kernels._axes import int_list
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["constant", "constant_of_shape", "densify"]


def densify(sparse: Any) -> np.ndarray:
    """A dense array from a ``SparseTensorProto`` (linear or coordinate indices)."""
    if isinstance(sparse, np.ndarray):
        return sparse
    if not isinstance(sparse, onnx.SparseTensorProto):
        raise KernelError(
            f"Constant: sparse_value of type {type(sparse).__name__} is not "
            "supported; pass a SparseTensorProto"
        )
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(sparse.dims)
    out = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 2:
        out[tuple(indices.T)] = values
    else:
        out.reshape(-1)[indices] = values
    return out


@kernel("Constant", since=1)
def constant(
    *,
    value: np.ndarray | None = None,
    sparse_value: Any = None,
    value_float: float | None = None,
    value_floats: list[float] | None = None,
    value_int: int | None = None,
    value_ints: list[int] | None = None,
    value_string: str | None = None,
    value_strings: list[str] | None = None,
) -> np.ndarray:
    """The one value attribute that is set, as a tensor of its natural type."""
    given = {
        k: v
        for k, v in {
            "value": value,
            "sparse_value": sparse_value,
            "value_float": value_float,
            "value_floats": value_floats,
            "value_int": value_int,
            "value_ints": value_ints,
            "value_string": value_string,
            "value_strings": value_strings,
        }.items()
        if v is not None
    }
    if len(given) != 1:
        raise KernelError(f"Constant needs exactly one value attribute, got {sorted(given)}")
    name, v = next(iter(given.items()))
    if name == "value":
        return np.array(v)
    if name == "sparse_value":
        return densify(v)
    if name in ("value_float", "value_floats"):
        return np.array(v, dtype=np.float32)
    if name in ("value_int", "value_ints"):
        return np.array(v, dtype=np.int64)
    return np.array(v, dtype=object)


@kernel("ConstantOfShape", since=9)
def constant_of_shape(shape: np.ndarray, *, value: np.ndarray | None = None) -> np.ndarray:
    """A tensor of ``shape`` filled with the one-element ``value`` (default float32 0)."""
    fill = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value)
    if fill.size != 1:
        raise KernelError(f"ConstantOfShape: 'value' must hold one element, got {fill.size}")
    dims = tuple(int_list(shape))
    if any(d < 0 for d in dims):
        raise KernelError(f"ConstantOfShape: negative dimension in shape {dims}")
    return np.full(dims, fill.reshape(()), dtype=fill.dtype)
