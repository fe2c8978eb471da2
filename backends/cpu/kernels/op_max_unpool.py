"""MaxUnpool: scatter pooled values back to the positions MaxPool's indices name."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["max_unpool"]


@kernel("MaxUnpool", since=9)
def max_unpool(
    x: np.ndarray,
    indices: np.ndarray,
    output_shape: np.ndarray | None = None,
    *,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    nd = x.ndim - 2
    strides = list(strides) if strides else [1] * nd
    p = list(pads) if pads else [0] * (2 * nd)
    # Indices are flat positions in the whole (N, C, *spatial) tensor that MaxPool saw,
    # i.e. the shape the attributes imply; a larger output_shape only pads its far ends.
    natural = x.shape[:2] + tuple(
        (s - 1) * st + k - p[a] - p[nd + a]
        for a, (s, st, k) in enumerate(zip(x.shape[2:], strides, kernel_shape))
    )
    total = int(np.prod(natural, dtype=np.int64))
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size != x.size:
        raise ModelError(f"MaxUnpool: indices {indices.shape} must match X {x.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= total):
        raise ModelError(f"MaxUnpool: an index is outside the unpooled shape {natural}")
    flat = np.zeros(total, dtype=x.dtype)
    flat[idx] = x.reshape(-1)
    out = flat.reshape(natural)
    if output_shape is None or not np.asarray(output_shape).size:
        return out
    shape = tuple(int(v) for v in np.asarray(output_shape).reshape(-1))
    if len(shape) != x.ndim:
        raise ModelError(f"MaxUnpool: output_shape {list(shape)} must have rank {x.ndim}")
    full = np.zeros(shape, dtype=x.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(shape, natural))
    full[common] = out[common]
    return full
