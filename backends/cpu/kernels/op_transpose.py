"""Transpose: permute axes (default: reverse them). The result is made contiguous so the
ops after it read memory in order. ``anychip::TransposeView`` (``passes/view_transposes.py``)
is the same permutation as a view, for readers that take strided input as fast."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["transpose", "transpose_view"]


@kernel("Transpose", since=1)
def transpose(
    data: np.ndarray, *, perm: list[int] | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """``data`` with axes permuted by ``perm``."""
    if perm is not None and sorted(perm) != list(range(data.ndim)):
        raise KernelError(
            f"Transpose: perm {perm} is not a permutation of the {data.ndim} axes of the input"
        )
    view = np.transpose(data, perm)
    if not fits(out, view.shape, data.dtype):
        out = None
    if view.size >= TILED_FROM and view.ndim >= 2 and _moves_last_axis(view):
        copied = _onednn_copy(data, view, out)
        if copied is None:
            copied = _tiled_copy(view, out)
        if copied is not None:
            return copied
    if out is not None:
        np.copyto(out, view)
        return out
    return np.ascontiguousarray(view)


#: Elements from which a transpose that moves the last axis is copied by oneDNN's reorder
#: (float32), else in tiles. Below it numpy's copy is faster (quiet Sapphire Rapids, 2
#: threads: [4, 8, 128, 32] numpy 0.04 ms, reorder 0.14; [512, 512] numpy 0.29, reorder 0.17).
TILED_FROM = 1 << 18
#: Edge of a tile (elements): 64 x 64 float32 is 16 KiB, in L1 with its source rows.
TILE = 64


def _moves_last_axis(view: np.ndarray) -> bool:
    return int(np.argmin([abs(st) for st in view.strides])) != view.ndim - 1


def _onednn_copy(data: np.ndarray, view: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    """``view`` (a permutation of contiguous float32 ``data``) copied contiguous by oneDNN's
    reorder (JIT-compiled blocked copies, on its threads): 1024 x 1024 in 0.4 ms where numpy
    took 7.3 and Python-looped tiles 1.4 (onnxruntime 0.5). None without oneDNN."""
    if data.dtype != np.float32 or not data.flags.c_contiguous:
        return None
    from anychip.backends.cpu.onednn import available

    if not available():
        return None
    from anychip.backends.cpu.onednn import _prim as P
    from anychip.backends.cpu.onednn._lib import C

    shape, strides = view.shape, tuple(st // 4 for st in view.strides)
    dense = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))

    def build() -> P.Prim:
        return P.reorder_prim(P.md_strided(shape, strides), P.md_strided(shape, dense))

    try:
        prim = P.cached(("reorder", ("transpose", shape, strides)), build)
    except P.Unsupported:
        return None
    result = np.empty(shape, np.float32) if out is None else out
    prim.run({C.arg_src: data, C.arg_dst: result})
    return result


def _tiled_copy(view: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    """``view`` copied contiguous in ``TILE`` x ``TILE`` tiles over the two axes that decide
    its memory order (the result's last axis and the one the input's last axis went to), or
    None when the last axis stays where it is (a copy of whole rows: numpy's order is right).

    Copied in the result's order, numpy's inner loop reads the source a row stride apart;
    at a power-of-two row stride every read lands in the same few cache sets: a 1024 x 1024
    float32 transpose took 7.3 ms against 0.71 ms at 1000 x 1000 and onnxruntime's 0.78 ms
    (quiet Sapphire Rapids). A tile's rows stay in L1 while its columns are read."""
    src_last = int(np.argmin([abs(st) for st in view.strides]))  # where the input's rows went
    last = view.ndim - 1
    if src_last == last or view.shape[src_last] < 2 * TILE or view.shape[last] < 2 * TILE:
        return None
    result = np.empty(view.shape, view.dtype) if out is None else out
    whole = [slice(None)] * view.ndim
    for i in range(0, view.shape[src_last], TILE):
        whole[src_last] = slice(i, i + TILE)
        for j in range(0, view.shape[last], TILE):
            whole[last] = slice(j, j + TILE)
            index = tuple(whole)
            result[index] = view[index]
    return result


@kernel(
    "TransposeView", domain=ANYCHIP_DOMAIN, since=1, dtypes=(DType.FLOAT, DType.DOUBLE), alias=True
)
def transpose_view(data: np.ndarray, *, perm: list[int]) -> np.ndarray:
    """``data`` with axes permuted by ``perm``, a view of ``data`` (no copy)."""
    if sorted(perm) != list(range(data.ndim)):
        raise KernelError(
            f"TransposeView: perm {perm} is not a permutation of the {data.ndim} axes of the input"
        )
    return data.transpose(perm)
