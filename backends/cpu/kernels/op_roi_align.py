"""RoiAlign: average (or max) of bilinear samples on a regular grid inside each RoI bin.

Sampling follows Mask R-CNN's reference (also onnxruntime's): a sample more than one pixel
outside the map is zero, coordinates below 0 clamp to 0, and the last row/column clamps.
For 'avg' the bilinear weights are separable, so each RoI is two small matrix products;
'max' takes, per bin, the largest weighted corner value over all samples.
"""

from __future__ import annotations

import math

import numpy as np

from anychip.backends.cpu.kernels._common import FLOAT_WITH_BF16, compute_dtype
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["roi_align"]


def _axis_samples(
    start: float, bin_size: float, bins: int, grid: int, size: int
) -> tuple[np.ndarray, ...]:
    """Low/high indices, their weights and validity of every sample along one axis."""
    pos = (
        start
        + np.arange(bins)[:, None] * bin_size
        + (np.arange(grid)[None, :] + 0.5) * bin_size / grid
    )  # [bins, grid]
    valid = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    pos = np.where(at_end, low.astype(np.float64), pos)
    frac = pos - low
    return low, high, 1.0 - frac, frac, valid


def _corner(
    img: np.ndarray, yi: np.ndarray, xi: np.ndarray, wy: np.ndarray, wx: np.ndarray
) -> np.ndarray:
    """One bilinear corner's weighted values for every sample: [C, oh, gh, ow, gw]."""
    v = img[:, yi[:, :, None, None], xi[None, None]]
    return v * (wy[:, :, None, None] * wx[None, None])


@kernel("RoiAlign", since=10, dtypes=FLOAT_WITH_BF16)
def roi_align(
    x: np.ndarray,
    rois: np.ndarray,
    batch_indices: np.ndarray,
    *,
    coordinate_transformation_mode: str = "output_half_pixel",
    mode: str = "avg",
    output_height: int = 1,
    output_width: int = 1,
    sampling_ratio: int = 0,
    spatial_scale: float = 1.0,
) -> np.ndarray:
    # Opset 10 had no coordinate_transformation_mode and behaved as 'output_half_pixel';
    # from opset 16 the runtime fills the schema default 'half_pixel'.
    if x.ndim != 4:
        raise ModelError(f"RoiAlign: X must be [N, C, H, W], got shape {x.shape}")
    if mode not in ("avg", "max"):
        raise ModelError(f"RoiAlign: mode must be 'avg' or 'max', got {mode!r}")
    _, c, h, w = x.shape
    shift = 0.5 if coordinate_transformation_mode == "half_pixel" else 0.0
    oh, ow = output_height, output_width
    work = np.float64
    data = x.astype(work)
    out = np.zeros((rois.shape[0], c, oh, ow), dtype=work)
    for r, (roi, bi) in enumerate(zip(rois.astype(work), np.asarray(batch_indices))):
        x1, y1, x2, y2 = roi * spatial_scale - shift
        rw, rh = x2 - x1, y2 - y1
        if coordinate_transformation_mode != "half_pixel":
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = sampling_ratio if sampling_ratio > 0 else math.ceil(rh / oh)
        gw = sampling_ratio if sampling_ratio > 0 else math.ceil(rw / ow)
        gh, gw = max(gh, 1), max(gw, 1)
        yl, yh, wyl, wyh, vy = _axis_samples(y1, bh, oh, gh, h)
        xl, xh, wxl, wxh, vx = _axis_samples(x1, bw, ow, gw, w)
        img = data[int(bi)]
        if mode == "avg":
            my = np.zeros((oh, h))
            mx = np.zeros((ow, w))
            rows = np.broadcast_to(np.arange(oh)[:, None], yl.shape)
            np.add.at(my, (rows, yl), wyl * vy)
            np.add.at(my, (rows, yh), wyh * vy)
            cols = np.broadcast_to(np.arange(ow)[:, None], xl.shape)
            np.add.at(mx, (cols, xl), wxl * vx)
            np.add.at(mx, (cols, xh), wxh * vx)
            out[r] = my @ img @ mx.T / (gh * gw)
        else:
            # [C, oh, gh, ow, gw] weighted corners; the sample value is their max.
            best = np.maximum.reduce(
                [
                    _corner(img, yl, xl, wyl, wxl),
                    _corner(img, yl, xh, wyl, wxh),
                    _corner(img, yh, xl, wyh, wxl),
                    _corner(img, yh, xh, wyh, wxh),
                ]
            )
            valid = vy[:, :, None, None] & vx[None, None]
            best = np.where(valid, best, 0.0)
            out[r] = best.max(axis=(2, 4))
    return out.astype(compute_dtype(x.dtype)).astype(x.dtype)
