"""LabelEncoder (ai.onnx.ml, opsets 1, 2 and 4): a dictionary lookup per element.

Opset 1 maps strings to their index in ``classes_strings`` and back; opsets 2 and 4 map
``keys_*`` to ``values_*`` (4 adds the ``*_tensor`` forms), with the ``default_*`` of the
values' type for a missing key. A NaN key matches a NaN input, as in onnxruntime.
"""

from __future__ import annotations

import math
from itertools import repeat
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._ml_common import ML, compiled
from anychip.backends.cpu.table import kernel
from anychip.core.run.kernel_call import KernelContext
from anychip.errors import KernelError

__all__ = ["label_encoder_1", "label_encoder"]

_NAN = object()  # the dictionary key of a NaN (NaN != NaN)


def _key(k: Any) -> Any:
    return _NAN if isinstance(k, float) and math.isnan(k) else k


def _lookup(x: np.ndarray, table: dict, default: Any, dtype: Any) -> np.ndarray:
    arr = np.asarray(x)
    flat = arr.ravel().tolist()
    if arr.dtype.kind == "f" and np.isnan(arr).any():  # only floats can be NaN
        flat = [_key(k) for k in flat]
    out = list(map(table.get, flat, repeat(default)))
    return np.array(out, dtype=dtype).reshape(arr.shape)


@kernel("LabelEncoder", domain=ML, since=1, context=True)
def label_encoder_1(
    ctx: KernelContext,
    x: np.ndarray,
    *,
    classes_strings: list[str] | None = None,
    default_int64: int = -1,
    default_string: str = "_Unused",
) -> np.ndarray:
    classes = list(classes_strings or [])
    to_index, to_string = compiled(
        ctx, lambda: ({c: i for i, c in enumerate(classes)}, dict(enumerate(classes)))
    )
    if np.asarray(x).dtype.kind in "OUS":
        return _lookup(x, to_index, default_int64, np.int64)
    return _lookup(x, to_string, default_string, object)


def _values(a: dict[str, Any], what: str) -> tuple[list, Any]:
    """The ``keys``/``values`` list of whichever attribute form is given, and its dtype."""
    t = a.get(f"{what}_tensor")
    if t is not None:
        arr = np.asarray(t)
        return arr.ravel().tolist(), object if arr.dtype.kind in "OUS" else arr.dtype
    for suffix, dtype in (("strings", object), ("int64s", np.int64), ("floats", np.float32)):
        v = a.get(f"{what}_{suffix}")
        if v:
            return list(v), dtype
    raise KernelError(f"LabelEncoder: no {what}_* attribute is given")


@kernel("LabelEncoder", domain=ML, since=2, context=True)
def label_encoder(ctx: KernelContext, x: np.ndarray, **a: Any) -> np.ndarray:
    table, default, dtype = compiled(ctx, lambda: _table(a))
    return _lookup(x, table, default, dtype)


def _table(a: dict[str, Any]) -> tuple[dict, Any, Any]:
    """The key -> value dictionary, the default and the output type (once per node)."""
    keys, _ = _values(a, "keys")
    values, dtype = _values(a, "values")
    if len(keys) != len(values):
        raise KernelError(f"LabelEncoder: {len(keys)} keys but {len(values)} values")
    if a.get("default_tensor") is not None:
        default = np.asarray(a["default_tensor"]).ravel().tolist()[0]
    elif dtype is object:
        default = a.get("default_string", "_Unused")
    elif np.dtype(dtype).kind in "iu":
        default = a.get("default_int64", -1)
    else:
        default = a.get("default_float", -0.0)
    return {_key(k): v for k, v in zip(keys, values)}, default, dtype
