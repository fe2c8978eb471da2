"""DepthToSpace and SpaceToDepth: move [blocksize x blocksize] blocks between channels and
space, in DCR (depth-column-row) or CRD (column-row-depth) order."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["depth_to_space", "space_to_depth"]


def _check(x: np.ndarray, op: str) -> None:
    if x.ndim != 4:
        raise ModelError(f"{op}: input must be 4-D [N, C, H, W], got shape {x.shape}")


@kernel("DepthToSpace", since=1)
def depth_to_space(x: np.ndarray, *, blocksize: int, mode: str = "DCR") -> np.ndarray:
    _check(x, "DepthToSpace")
    n, c, h, w = x.shape
    b = blocksize
    if c % (b * b):
        raise ModelError(f"DepthToSpace: channels {c} are not divisible by blocksize^2={b * b}")
    if mode == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ModelError(f"DepthToSpace: mode must be 'DCR' or 'CRD', got {mode!r}")
    return t.reshape(n, c // (b * b), h * b, w * b)


@kernel("SpaceToDepth", since=1)
def space_to_depth(x: np.ndarray, *, blocksize: int, mode: str = "DCR") -> np.ndarray:
    _check(x, "SpaceToDepth")
    n, c, h, w = x.shape
    b = blocksize
    if h % b or w % b:
        raise ModelError(f"SpaceToDepth: H={h} and W={w} must be divisible by blocksize={b}")
    t = x.reshape(n, c, h // b, b, w // b, b)
    if mode == "DCR":
        t = t.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        t = t.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ModelError(f"SpaceToDepth: mode must be 'DCR' or 'CRD', got {mode!r}")
    return t.reshape(n, c * b * b, h // b, w // b)
