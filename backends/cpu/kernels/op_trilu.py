"""Trilu: keep the upper or lower triangle (offset by k) of the last two dimensions."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel

__all__ = ["trilu"]


@kernel("Trilu", since=14)
def trilu(x: np.ndarray, k: np.ndarray | None = None, *, upper: int = 1) -> np.ndarray:
    kk = int(np.asarray(k).reshape(-1)[0]) if k is not None else 0
    rows, cols = x.shape[-2], x.shape[-1]
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    keep = (c - r >= kk) if upper else (c - r <= kk)
    return np.where(keep, x, np.zeros((), dtype=x.dtype)).astype(x.dtype, copy=False)
