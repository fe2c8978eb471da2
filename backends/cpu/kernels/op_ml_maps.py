"""ai.onnx.ml ops that produce or consume maps: ZipMap, DictVectorizer, CastMap.

A map at run time is a Python ``dict`` and a sequence of maps a ``list`` of them, the forms
onnxruntime's Python API takes and returns (every scikit-learn classifier converted by
skl2onnx ends in ZipMap, giving ``[{label: probability, ...}, ...]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._ml_common import ML
from anychip.backends.cpu.table import kernel
from anychip.core.run.kernel_call import KernelContext
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["zip_map", "dict_vectorizer", "cast_map"]


@kernel("ZipMap", domain=ML, since=1)
def zip_map(
    x: np.ndarray,
    *,
    classlabels_int64s: list[int] | None = None,
    classlabels_strings: list[str] | None = None,
) -> tuple[list[dict[Any, float]]]:
    """One ``{label: score}`` dict per row of ``x``."""
    labels: list[Any] = list(classlabels_int64s or classlabels_strings or [])
    if not labels:
        raise KernelError("ZipMap: neither classlabels_int64s nor classlabels_strings is given")
    x = np.asarray(x)
    if x.ndim == 2 and x.shape[1] != len(labels):
        raise KernelError(
            f"ZipMap: {len(labels)} class labels but the input has {x.shape[1]} columns"
        )
    rows = x.reshape(-1, len(labels)) if x.size else np.zeros((0, len(labels)))
    return (_zipper(tuple(labels))(rows.tolist()),)


_ZIPPERS: dict[tuple, Callable[[list], list[dict]]] = {}


def _zipper(labels: tuple) -> Callable[[list], list[dict]]:
    """A function turning rows (lists) into ``{label: value}`` dicts: for up to 64 labels a
    comprehension with one name per label, ``[{k0: v0, k1: v1} for v0, v1 in rows]``, twice
    as fast as ``dict(zip(labels, row))`` per row (the labels are bound as names, never
    written into the source)."""
    fn = _ZIPPERS.get(labels)
    if fn is not None:
        return fn
    if len(labels) > 64:
        fn = lambda rows: [dict(zip(labels, row)) for row in rows]  # noqa: E731
    else:
        names = {f"k{i}": label for i, label in enumerate(labels)}
        items = ", ".join(f"k{i}: v{i}" for i in range(len(labels)))
        values = "".join(f"v{i}, " for i in range(len(labels)))
        fn = eval(f"lambda rows: [{{{items}}} for {values} in rows]", names)
    if len(_ZIPPERS) < 1024:
        _ZIPPERS[labels] = fn
    return fn


def _value_dtype(ctx: KernelContext) -> np.dtype | None:
    """The numpy type of the map's values, from the input's declared map type."""
    tp = ctx.node.inputs[0].type_proto
    if tp is None or tp.WhichOneof("value") != "map_type":
        return None
    elem = tp.map_type.value_type.tensor_type.elem_type
    return DType(elem).numpy if elem and DType(elem) != DType.STRING else None


@kernel("DictVectorizer", domain=ML, since=1, context=True)
def dict_vectorizer(
    ctx: KernelContext,
    x: dict,
    *,
    int64_vocabulary: list[int] | None = None,
    string_vocabulary: list[str] | None = None,
) -> np.ndarray:
    """A ``[1, len(vocabulary)]`` row of the map's values, 0 for keys it lacks (keys outside
    the vocabulary are ignored)."""
    vocab: list[Any] = list(int64_vocabulary or string_vocabulary or [])
    maps = x if isinstance(x, list) else [x]
    if not all(isinstance(m, dict) for m in maps):
        raise KernelError(f"DictVectorizer: input must be a map (dict), got {type(x).__name__}")
    values = [v for m in maps for v in m.values()]
    dtype = _value_dtype(ctx) or (np.asarray(values).dtype if values else np.float32)
    if np.dtype(dtype).kind in "OUS":
        dtype = np.dtype(object)
    position = {k: i for i, k in enumerate(vocab)}
    out = np.zeros((len(maps), len(vocab)), dtype=dtype)
    for r, m in enumerate(maps):
        for k, v in m.items():
            i = position.get(k)
            if i is not None:
                out[r, i] = v
    return out


@kernel("CastMap", domain=ML, since=1)
def cast_map(
    x: dict, *, cast_to: str = "TO_FLOAT", map_form: str = "DENSE", max_map: int = 1
) -> np.ndarray:
    """Values of an int64-keyed map as a row, in key order (DENSE) or at their keys
    (SPARSE, ``max_map`` columns)."""
    types = {"TO_FLOAT": np.float32, "TO_INT64": np.int64, "TO_STRING": object}
    if cast_to not in types:
        raise KernelError(f"CastMap: cast_to {cast_to!r} is not one of {list(types)}")
    keys = sorted(x)
    if map_form == "SPARSE":
        out = np.zeros((1, max_map), dtype=types[cast_to])
        for k in keys:
            if 0 <= k < max_map:
                out[0, k] = x[k]
        return out
    values = [x[k] for k in keys]
    if cast_to == "TO_STRING":
        return np.array([[str(v) for v in values]], dtype=object)
    return np.asarray(values).astype(types[cast_to]).reshape(1, -1)
