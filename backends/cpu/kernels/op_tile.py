"""Tile: repeat the input along each axis (opset 1: one axis and a count, as inputs)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._axes import int_list, norm_axis
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["tile_v1", "tile"]


@kernel("Tile", since=1)
def tile_v1(x: np.ndarray, tiles: np.ndarray, axis: np.ndarray) -> np.ndarray:
    """Opsets 1-5: repeat ``tiles`` times along the single ``axis``."""
    reps = [1] * x.ndim
    reps[norm_axis(int(np.asarray(axis).reshape(())), x.ndim, "Tile")] = int(
        np.asarray(tiles).reshape(())
    )
    return np.tile(x, reps)


@kernel("Tile", since=6)
def tile(x: np.ndarray, repeats: np.ndarray) -> np.ndarray:
    """Opset 6+: ``repeats`` has one non-negative count per axis."""
    reps = int_list(repeats)
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        raise KernelError(
            f"Tile: repeats {reps} must have one non-negative count per axis of "
            f"the input of shape {x.shape}"
        )
    return np.tile(x, reps)
