"""Concat: join inputs along ``axis`` (opset 1 defaults it to 1; negative from opset 11).

The memory planner may place the inputs inside the planned output (``core/memory/
concat_inplace.py``): their producers then wrote them where they belong, and only the inputs
not found at their place in ``out`` are copied."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._axes import norm_axis
from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.replay import record as _replay
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["concat"]


@kernel("Concat", since=1)
def concat(
    *inputs: np.ndarray, axis: int | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """All inputs share every dimension except ``axis``."""
    arrays = [x for x in inputs if x is not None]
    if not arrays:
        raise KernelError("Concat needs at least one input")
    a = norm_axis(1 if axis is None else axis, arrays[0].ndim, "Concat")
    # numpy checks ranks and the other dimensions (a Python loop over 92 inputs of
    # PolynomialFeatures cost more than the copy); its refusal is reworded below.
    try:
        if out is not None:
            first = arrays[0]
            shape = first.shape[:a] + (sum(x.shape[a] for x in arrays),) + first.shape[a + 1 :]
            if fits(out, shape, first.dtype):
                if out.base is not None and any(x.base is out.base for x in arrays):
                    placed = _into_place(arrays, a, out)
                    if placed is not None:
                        _replay.seal()  # the copies it noted: all it did
                        return placed
                try:
                    _concatenate(arrays, a, out)
                except TypeError:
                    pass  # mixed dtypes: numpy's promotion, in a fresh array
                else:
                    if _replay.ACTIVE:  # that one call: all it did
                        _replay.note(_concatenate, (arrays, a, out))
                        _replay.seal()
                    return out
        return np.concatenate(arrays, axis=a)
    except (ValueError, IndexError) as e:  # IndexError: an input of lower rank
        raise KernelError(
            f"Concat: input shapes {[t.shape for t in arrays]} differ outside axis {a} ({e})"
        ) from e


def _concatenate(arrays: list[np.ndarray], a: int, out: np.ndarray) -> None:
    np.concatenate(arrays, axis=a, out=out, casting="no")


def _into_place(arrays: list[np.ndarray], a: int, out: np.ndarray) -> np.ndarray | None:
    """``out`` with every input copied into its slice, skipping the inputs that already are
    that slice (planned there); None when an input's dtype or its shape off the axis differs
    (numpy's promotion, or its refusal, then)."""
    rest = out.shape[a + 1 :]
    if any(x.dtype != out.dtype or x.ndim != out.ndim or x.shape[a + 1 :] != rest for x in arrays):
        return None
    lead = (slice(None),) * a
    start = 0
    for x in arrays:
        stop = start + x.shape[a]
        dst = out[lead + (slice(start, stop),)]
        if not _same_memory(x, dst):
            _replay.copy(dst, x)
        start = stop
    return out


def _same_memory(x: np.ndarray, dst: np.ndarray) -> bool:
    """Whether ``x`` is exactly the array ``dst`` views: same first byte and shape, both in C
    order (numpy's flag ignores the strides of size-1 dimensions, which differ here)."""
    return (
        x.shape == dst.shape
        and x.flags.c_contiguous
        and dst.flags.c_contiguous
        and x.__array_interface__["data"][0] == dst.__array_interface__["data"][0]
    )
