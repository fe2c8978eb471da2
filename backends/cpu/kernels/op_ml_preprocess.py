"""Scaler, Normalizer, Imputer and OneHotEncoder (ai.onnx.ml), vectorised with numpy, with
the semantics of onnx's reference evaluator (which onnxruntime matches)."""

from __future__ import annotations

from itertools import repeat

import numpy as np

from anychip.backends.cpu.kernels._ml_common import ML, compiled
from anychip.backends.cpu.table import kernel
from anychip.core.run.kernel_call import KernelContext
from anychip.errors import KernelError

__all__ = ["scaler", "normalizer", "imputer", "one_hot_encoder"]


@kernel("Scaler", domain=ML, since=1)
def scaler(
    x: np.ndarray, *, offset: list[float] | None = None, scale: list[float] | None = None
) -> np.ndarray:
    """``(x - offset) * scale`` per column (one value broadcasts), in float32 for non-double
    input, as onnxruntime."""
    work = np.float64 if x.dtype == np.float64 else np.float32
    off = np.asarray(offset if offset else [0.0], work)
    sc = np.asarray(scale if scale else [1.0], work)
    return ((x.astype(work) - off) * sc).astype(work)


@kernel("Normalizer", domain=ML, since=1)
def normalizer(x: np.ndarray, *, norm: str = "MAX") -> np.ndarray:
    v = np.asarray(x)
    v = v if v.dtype == np.float64 else v.astype(np.float32)
    v = v.reshape(1, -1) if v.ndim == 1 else v
    if norm == "MAX":
        div = np.abs(v).max(axis=1, keepdims=True)
    elif norm == "L1":
        div = np.abs(v).sum(axis=1, keepdims=True)
    elif norm == "L2":
        div = np.sqrt(np.square(v).sum(axis=1, keepdims=True))
    else:
        raise KernelError(f"Normalizer: norm {norm!r} is not MAX, L1 or L2")
    return v / np.maximum(div, v.dtype.type(1e-30))


@kernel("Imputer", domain=ML, since=1, context=True)
def imputer(
    ctx: KernelContext,
    x: np.ndarray,
    *,
    imputed_value_floats: list[float] | None = None,
    imputed_value_int64s: list[int] | None = None,
    replaced_value_float: float = 0.0,
    replaced_value_int64: int = 0,
) -> np.ndarray:
    """Replace ``replaced_value_*`` (NaN matches NaN) by the column's imputed value."""
    if imputed_value_floats:
        floats, target = True, replaced_value_float
    elif imputed_value_int64s:
        floats, target = False, replaced_value_int64
    else:
        raise KernelError("Imputer: neither imputed_value_floats nor imputed_value_int64s is given")
    # The values as an array per input type, made once per node (converting the attribute
    # list on every run cost as much as the replacement).
    cache: dict = compiled(ctx, dict)
    values = cache.get(x.dtype)
    if values is None:
        raw = np.asarray(imputed_value_floats if floats else imputed_value_int64s)
        values = cache[x.dtype] = raw.astype(x.dtype).reshape(1, -1)
    if x.ndim != 2 or values.shape[1] not in (1, x.shape[1]):
        raise KernelError(
            f"Imputer: {values.shape[1]} imputed values for an input of shape {list(x.shape)}"
        )
    hit = np.isnan(x) if isinstance(target, float) and target != target else x == target
    return np.where(hit, values, x)


@kernel("OneHotEncoder", domain=ML, since=1, context=True)
def one_hot_encoder(
    ctx: KernelContext,
    x: np.ndarray,
    *,
    cats_int64s: list[int] | None = None,
    cats_strings: list[str] | None = None,
    zeros: int = 1,
) -> np.ndarray:
    """``[..., len(categories)]`` float32 one-hot; a value outside the categories is all
    zeros, or an error when ``zeros=0``."""
    cats = list(cats_int64s) if cats_int64s else list(cats_strings or [])
    if not cats:
        raise KernelError("OneHotEncoder: neither cats_int64s nor cats_strings is given")
    if not cats_int64s:  # strings: a dictionary lookup (converting to numpy str is slower)
        index = compiled(ctx, lambda: {str(c): i for i, c in reversed(list(enumerate(cats)))})
        flat_list = np.asarray(x, dtype=object).ravel().tolist()
        get = index.get
        pos = np.fromiter(map(get, flat_list, repeat(-1)), np.int64, len(flat_list))
        for i in np.nonzero(pos < 0)[0].tolist():  # a non-str value (bytes, number) as text
            if not isinstance(flat_list[i], str):
                pos[i] = get(str(flat_list[i]), -1)
        out = np.zeros((pos.size, len(cats)), np.float32)
        rows = np.nonzero(pos >= 0)[0]
        out[rows, pos[rows]] = 1.0
        if not zeros and rows.size != pos.size:
            bad = flat_list[int(np.nonzero(pos < 0)[0][0])]
            raise KernelError(f"OneHotEncoder: value {bad!r} is not a category and zeros=0")
        return out.reshape(*np.shape(x), len(cats))
    if cats_int64s:
        keys = np.asarray(cats, np.int64)
        flat = np.asarray(x).astype(np.int64).ravel()
    else:
        keys = np.asarray(cats, dtype=object).astype(str)
        flat = np.asarray(x, dtype=object).astype(str).ravel()
    order = np.argsort(keys, kind="stable")
    pos = np.searchsorted(keys[order], flat)
    pos = np.minimum(pos, len(keys) - 1)
    found = keys[order][pos] == flat
    out = np.zeros((flat.size, len(cats)), np.float32)
    rows = np.nonzero(found)[0]
    out[rows, order[pos[rows]]] = 1.0
    if not zeros and not found.all():
        raise KernelError(f"OneHotEncoder: value {flat[~found][0]!r} is not a category and zeros=0")
    return out.reshape(*np.shape(x), len(cats))
