"""Conversions between ONNX protos and IR pieces: tensors, sparse tensors and types.

Invariants:
    * Tensors become numpy arrays whose dtype is ``DType(data_type).numpy`` (ml_dtypes types
      for bfloat16, float8 and the 4-bit families); string tensors become ``object`` arrays of
      ``str`` (bytes that are not UTF-8 survive the round trip through ``surrogateescape``).
    * Sparse tensors are densified on import (zeros where no value is given).
    * A ``TypeProto`` that is not a plain tensor is kept whole in ``Value.type_proto``.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import numpy as np
import onnx
from onnx import numpy_helper

from anychip.errors import ModelError, UnsupportedDTypeError
from anychip.ir.dtypes import DType
from anychip.ir.value import Value

__all__ = [
    "to_dtype",
    "tensor_to_array",
    "array_to_tensor",
    "sparse_to_dense",
    "dense_to_sparse",
    "apply_type",
    "type_proto_of",
]


def to_dtype(code: int, what: str) -> DType:
    """``DType(code)``, or an ``UnsupportedDTypeError`` naming ``what`` carries the type."""
    try:
        return DType(code)
    except ValueError:
        raise UnsupportedDTypeError(
            f"{what} has ONNX element type {code}, unknown to this anychip build; upgrade "
            "anychip or convert the model to a supported type"
        ) from None


def tensor_to_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The numpy value of ``tensor`` (its data must already be in memory)."""
    dtype = to_dtype(tensor.data_type, f"tensor {tensor.name!r}")
    if dtype == DType.STRING:
        items = [s.decode("utf-8", errors="surrogateescape") for s in tensor.string_data]
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(tuple(tensor.dims))
    try:
        array = numpy_helper.to_array(tensor)
    except Exception as e:  # onnx raises ValueError/TypeError for inconsistent data sizes
        raise ModelError(
            f"tensor {tensor.name!r} ({dtype.name}, dims {list(tensor.dims)}) cannot be read: "
            f"{e}. The file is corrupt or was written by a broken exporter"
        ) from None
    want = dtype.numpy
    if array.dtype != want:
        array = array.astype(want)
    return array


def array_to_tensor(array: np.ndarray, name: str, dtype: DType | None = None) -> onnx.TensorProto:
    """A ``TensorProto`` holding ``array`` (numeric data goes to ``raw_data``)."""
    array = np.asarray(array)
    if dtype is None:
        dtype = DType.from_numpy(array.dtype)
    if dtype == DType.STRING:
        tensor = onnx.TensorProto(name=name, data_type=onnx.TensorProto.STRING)
        tensor.dims.extend(array.shape)
        tensor.string_data.extend(_encode(s) for s in array.reshape(-1))
        return tensor
    if array.dtype != dtype.numpy:
        array = array.astype(dtype.numpy)
    tensor = numpy_helper.from_array(array, name)
    if tensor.data_type != int(dtype):
        raise UnsupportedDTypeError(
            f"tensor {name!r}: numpy dtype {array.dtype} was written as ONNX type "
            f"{tensor.data_type}, expected {dtype.name}; upgrade onnx"
        )
    return tensor


def _encode(s: object) -> bytes:
    if isinstance(s, bytes):
        return s
    return str(s).encode("utf-8", errors="surrogateescape")


def sparse_to_dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """The dense numpy value of a sparse tensor (missing entries are zero, or "" for strings).

    Raises:
        ModelError: indices are out of range or do not match the number of values.
    """
    values = tensor_to_array(sparse.values)
    indices = tensor_to_array(sparse.indices).astype(np.int64)
    dims = tuple(sparse.dims)
    name = sparse.values.name or "<unnamed sparse tensor>"
    try:
        if values.dtype == object:
            dense = np.full(dims, "", dtype=object)
        else:
            dense = np.zeros(dims, dtype=values.dtype)
    except (MemoryError, ValueError) as e:
        raise ModelError(
            f"sparse tensor {name!r} (dims {list(dims)}) cannot be made dense here: "
            f"{type(e).__name__}: {e}; set max_load_bytes (or ANYCHIP_MAX_LOAD_BYTES) to refuse "
            "such models before they load"
        ) from None
    try:
        if indices.ndim == 1:
            # Linearised indices into the row-major flattened tensor.
            dense.reshape(-1)[indices] = values.reshape(-1)
        else:
            dense[tuple(indices.T)] = values.reshape(-1)
    except (IndexError, ValueError) as e:
        raise ModelError(
            f"sparse tensor {name!r} (dims {list(dims)}) has indices that do not fit it: {e}"
        ) from None
    return dense


def dense_to_sparse(array: np.ndarray, name: str) -> onnx.SparseTensorProto:
    """A sparse tensor with linearised indices of the non-zero entries of ``array``."""
    flat = array.reshape(-1)
    if array.dtype == object:
        nonzero = np.array([i for i, s in enumerate(flat) if s != ""], dtype=np.int64)
    else:
        nonzero = np.flatnonzero(flat != 0).astype(np.int64)
    sparse = onnx.SparseTensorProto()
    sparse.dims.extend(array.shape)
    sparse.values.CopyFrom(
        array_to_tensor(
            flat[nonzero],
            name,
            DType.from_numpy(array.dtype) if array.dtype != object else DType.STRING,
        )
    )
    sparse.indices.CopyFrom(array_to_tensor(nonzero, name + "_indices", DType.INT64))
    return sparse


def apply_type(
    value: Value,
    tp: onnx.TypeProto,
    unknown_dims: AbstractSet[str] = frozenset(),
) -> None:
    """Set ``value``'s dtype/shape (or ``type_proto``) from ``tp``; unknown parts stay unknown.

    ``unknown_dims`` are dimension names that mean "unknown" (the ``unk__N`` names that ONNX
    shape inference invents); they become ``None``.
    """
    which = tp.WhichOneof("value")
    if which is None:
        return
    if which == "tensor_type":
        tt = tp.tensor_type
        if tt.elem_type:
            value.dtype = to_dtype(tt.elem_type, f"value {value.name!r}")
        if tt.HasField("shape"):
            dims = (_dim(d) for d in tt.shape.dim)
            value.shape = tuple(None if d in unknown_dims else d for d in dims)
        value.type_proto = None
        return
    copy = onnx.TypeProto()
    copy.CopyFrom(tp)
    value.type_proto = copy
    elem = _element_dtype(tp)
    if elem is not None:
        value.dtype = elem


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str | None:
    if d.HasField("dim_value"):
        return int(d.dim_value)
    if d.HasField("dim_param") and d.dim_param:
        return d.dim_param
    return None


def _element_dtype(tp: onnx.TypeProto) -> DType | None:
    """The tensor element type at the bottom of a sequence/optional type, if there is one."""
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return to_dtype(tp.tensor_type.elem_type, "a sequence or optional element")
    if which == "sparse_tensor_type":
        return to_dtype(tp.sparse_tensor_type.elem_type, "a sparse tensor type")
    if which == "sequence_type":
        return _element_dtype(tp.sequence_type.elem_type)
    if which == "optional_type":
        return _element_dtype(tp.optional_type.elem_type)
    return None


def type_proto_of(value: Value) -> onnx.TypeProto | None:
    """The ``TypeProto`` describing ``value``, or None when nothing is known about it."""
    if value.type_proto is not None:
        copy = onnx.TypeProto()
        copy.CopyFrom(value.type_proto)
        return copy
    if value.dtype == DType.UNDEFINED:
        return None
    tp = onnx.TypeProto()
    tp.tensor_type.elem_type = int(value.dtype)
    if value.shape is not None:
        shape = tp.tensor_type.shape
        # An explicitly empty shape means a scalar, so the field must exist even with no dims.
        shape.SetInParent()
        for d in value.shape:
            dim = shape.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            elif d is not None:
                dim.dim_value = int(d)
    return tp
