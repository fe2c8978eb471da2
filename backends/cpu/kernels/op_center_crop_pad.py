"""CenterCropPad: crop (start rounded down) or zero-pad (extra pixel on the right) each axis
to a target size, keeping the content centred."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["center_crop_pad"]


@kernel("CenterCropPad", since=18)
def center_crop_pad(
    x: np.ndarray, shape: np.ndarray, *, axes: list[int] | None = None
) -> np.ndarray:
    r = x.ndim
    ax = [a + r if a < 0 else a for a in axes] if axes is not None else list(range(r))
    target = [int(v) for v in np.asarray(shape).reshape(-1)]
    if len(target) != len(ax):
        raise ModelError(f"CenterCropPad: {len(target)} sizes for {len(ax)} axes")
    src = [slice(None)] * r
    dst = [slice(None)] * r
    out_shape = list(x.shape)
    for a, t in zip(ax, target):
        n = x.shape[a]
        out_shape[a] = t
        if t <= n:
            start = (n - t) // 2
            src[a] = slice(start, start + t)
        else:
            start = (t - n) // 2
            dst[a] = slice(start, start + n)
    out = np.zeros(out_shape, dtype=x.dtype)
    out[tuple(dst)] = x[tuple(src)]
    return out
