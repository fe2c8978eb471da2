"""Axis helpers shared by the shape and reduction kernels (not a kernel module)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from anychip.errors import KernelError

__all__ = ["norm_axis", "norm_axes", "int_list"]


def norm_axis(axis: int, rank: int, op: str) -> int:
    """``axis`` made non-negative, checked against ``rank``."""
    if not -rank <= axis < rank:
        raise KernelError(
            f"{op}: axis {axis} is out of range for rank {rank} (valid: {-rank}..{rank - 1})"
        )
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Iterable[int], rank: int, op: str) -> list[int]:
    """Every axis made non-negative; duplicates are an error."""
    out = [norm_axis(int(a), rank, op) for a in axes]
    if len(set(out)) != len(out):
        raise KernelError(f"{op}: axes {list(axes)} repeat an axis")
    return out


def int_list(values: np.ndarray | Iterable[int] | None) -> list[int] | None:
    """A tensor or attribute list of integers as Python ints (None stays None)."""
    if values is None:
        return None
    if type(values) is np.ndarray and values.dtype.kind in "iu":
        return values.reshape(-1).tolist()  # Python ints already, without a loop
    return [int(v) for v in np.asarray(values).reshape(-1)]
