"""Resize (opsets 10-19) and Upsample (opsets 1-10).

Every resized axis is handled separately (the N-D nearest, N-linear and N-cubic modes are
separable): each axis gets the source coordinate of every output index from its coordinate
transformation, then either a gather (nearest) or a dense [out, in] weight matrix applied with
one tensordot (linear, cubic, antialias filters). ``tf_crop_and_resize`` outputs whose source
lies outside the input on any axis take ``extrapolation_value``.
"""

from __future__ import annotations

import math

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["resize", "resize_10", "upsample_1", "upsample_7", "upsample_9"]

_ROUND = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _source_coords(
    mode: str, n_in: int, n_out: int, scale: float, start: float, end: float
) -> np.ndarray:
    """Coordinate in the input of every output index along one axis (the spec's formulas).

    ``length_resized`` is the fractional target length ``n_in * scale`` (the doc's
    ``output_width``), which differs from ``n_out`` when a scale does not divide evenly.
    """
    x = np.arange(n_out, dtype=np.float64)
    length = n_in * scale
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (n_in * scale)
        offset = n_in / 2 * (1 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(x)
    if mode == "align_corners":
        return x * (n_in - 1) / (length - 1) if length > 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        if length > 1:
            return start * (n_in - 1) + x * (end - start) * (n_in - 1) / (length - 1)
        return np.full_like(x, 0.5 * (start + end) * (n_in - 1))
    raise ModelError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _filter_matrix(
    src: np.ndarray,
    n_in: int,
    mode: str,
    scale: float,
    antialias: int,
    exclude_outside: int,
    cubic_a: float,
) -> np.ndarray:
    """Dense [out, in] weights of a linear or cubic filter (stretched when antialiasing)."""
    radius = 1.0 if mode == "linear" else 2.0
    shrink = min(scale, 1.0) if antialias else 1.0
    reach = math.ceil(radius / shrink)
    base = np.floor(src)
    taps = base[:, None] + np.arange(-reach + 1, reach + 1)[None, :]  # [out, taps]
    t = (taps - src[:, None]) * shrink
    if mode == "linear":
        w = np.maximum(0.0, 1.0 - np.abs(t))
    else:
        w = _cubic(t, cubic_a)
    inside = (taps >= 0) & (taps <= n_in - 1)
    if exclude_outside:
        w = np.where(inside, w, 0.0)
    if antialias or exclude_outside:
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    cols = np.clip(taps, 0, n_in - 1).astype(np.int64)
    mat = np.zeros((src.size, n_in), dtype=np.float64)
    rows = np.broadcast_to(np.arange(src.size)[:, None], cols.shape)
    np.add.at(mat, (rows, cols), w)  # taps clamped to the edge add up there
    return mat


def _resize(
    x: np.ndarray,
    out_shape: list[int],
    scales: list[float],
    starts: list[float],
    ends: list[float],
    *,
    mode: str,
    ctm: str,
    nearest_mode: str,
    cubic_a: float,
    exclude_outside: int,
    extrapolation_value: float,
    antialias: int,
) -> np.ndarray:
    if mode not in ("nearest", "linear", "cubic"):
        raise ModelError(f"Resize: mode must be nearest, linear or cubic, got {mode!r}")
    if mode == "nearest" and nearest_mode not in _ROUND:
        raise ModelError(f"Resize: unknown nearest_mode {nearest_mode!r}")
    exact = x.dtype.kind in "iub"
    work = x if mode == "nearest" else x.astype(np.float64 if x.dtype == np.float64 else np.float32)
    outside = None
    for d, (n_in, n_out) in enumerate(zip(x.shape, out_shape)):
        if n_out == n_in and scales[d] == 1.0 and ctm != "tf_crop_and_resize":
            continue  # identity along this axis for every transformation mode
        src = _source_coords(ctm, n_in, n_out, scales[d], starts[d], ends[d])
        if ctm == "tf_crop_and_resize":
            off = (src < 0) | (src > n_in - 1)
            shape = [1] * x.ndim
            shape[d] = n_out
            off = off.reshape(shape)
            outside = off if outside is None else outside | off
        if mode == "nearest":
            idx = np.clip(_ROUND[nearest_mode](src), 0, n_in - 1).astype(np.int64)
            work = np.take(work, idx, axis=d)
        else:
            mat = _filter_matrix(
                src, n_in, mode, scales[d], antialias, exclude_outside, cubic_a
            ).astype(work.dtype)
            work = np.moveaxis(np.tensordot(mat, work, axes=([1], [d])), 0, d)
    if outside is not None:
        work = np.where(outside, np.asarray(extrapolation_value, dtype=work.dtype), work)
    if exact and mode != "nearest":
        info = np.iinfo(x.dtype) if x.dtype.kind in "iu" else None
        work = np.rint(work)
        if info is not None:
            work = np.clip(work, info.min, info.max)
    return np.ascontiguousarray(work).astype(x.dtype, copy=False)


@kernel("Resize", since=11)
def resize(
    x: np.ndarray,
    roi: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
    *,
    antialias: int = 0,
    axes: list[int] | None = None,
    coordinate_transformation_mode: str = "half_pixel",
    cubic_coeff_a: float = -0.75,
    exclude_outside: int = 0,
    extrapolation_value: float = 0.0,
    keep_aspect_ratio_policy: str = "stretch",
    mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
) -> np.ndarray:
    r = x.ndim
    ax = [a + r if a < 0 else a for a in axes] if axes is not None else list(range(r))
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    if (scales is None) == (sizes is None):
        raise ModelError("Resize: give exactly one of 'scales' and 'sizes' (the other empty)")
    full_scales = [1.0] * r
    out_shape = list(x.shape)
    if scales is not None:
        sc = np.asarray(scales, dtype=np.float64).reshape(-1)
        if sc.size != len(ax):
            raise ModelError(f"Resize: {sc.size} scales for {len(ax)} axes")
        for a, s in zip(ax, sc):
            full_scales[a] = float(s)
            out_shape[a] = int(math.floor(x.shape[a] * s))
    else:
        sz = np.asarray(sizes, dtype=np.int64).reshape(-1)
        if sz.size != len(ax):
            raise ModelError(f"Resize: {sz.size} sizes for {len(ax)} axes")
        ratios = [float(s) / x.shape[a] for a, s in zip(ax, sz)]
        if keep_aspect_ratio_policy == "stretch":
            for a, s, q in zip(ax, sz, ratios):
                out_shape[a], full_scales[a] = int(s), q
        elif keep_aspect_ratio_policy in ("not_larger", "not_smaller"):
            q = min(ratios) if keep_aspect_ratio_policy == "not_larger" else max(ratios)
            for a in ax:
                full_scales[a] = q
                out_shape[a] = int(math.floor(q * x.shape[a] + 0.5))
        else:
            raise ModelError(
                f"Resize: unknown keep_aspect_ratio_policy {keep_aspect_ratio_policy!r}"
            )
    starts, ends = [0.0] * r, [1.0] * r
    if roi is not None and roi.size and coordinate_transformation_mode == "tf_crop_and_resize":
        rv = np.asarray(roi, dtype=np.float64).reshape(-1)
        for i, a in enumerate(ax):
            starts[a], ends[a] = float(rv[i]), float(rv[i + len(ax)])
    return _resize(
        x,
        out_shape,
        full_scales,
        starts,
        ends,
        mode=mode,
        ctm=coordinate_transformation_mode,
        nearest_mode=nearest_mode,
        cubic_a=cubic_coeff_a,
        exclude_outside=exclude_outside,
        extrapolation_value=extrapolation_value,
        antialias=antialias,
    )


def _upsample(x: np.ndarray, scales: list[float], mode: str, op: str) -> np.ndarray:
    """Opset <= 10 resizing: asymmetric coordinates; nearest takes the floor."""
    if len(scales) != x.ndim:
        raise ModelError(f"{op}: {len(scales)} scales for a rank-{x.ndim} input")
    if mode == "bilinear":
        mode = "linear"
    out_shape = [int(math.floor(n * s)) for n, s in zip(x.shape, scales)]
    r = x.ndim
    return _resize(
        x,
        out_shape,
        [float(s) for s in scales],
        [0.0] * r,
        [1.0] * r,
        mode=mode,
        ctm="asymmetric",
        nearest_mode="floor",
        cubic_a=-0.75,
        exclude_outside=0,
        extrapolation_value=0.0,
        antialias=0,
    )


@kernel("Resize", since=10, until=10)
def resize_10(x: np.ndarray, scales: np.ndarray, *, mode: str = "nearest") -> np.ndarray:
    return _upsample(x, list(np.asarray(scales, dtype=np.float64).reshape(-1)), mode, "Resize")


@kernel("Upsample", since=1, until=6)
def upsample_1(
    x: np.ndarray, *, height_scale: float, width_scale: float, mode: str = "nearest"
) -> np.ndarray:
    return _upsample(x, [1.0, 1.0, height_scale, width_scale], mode, "Upsample")


@kernel("Upsample", since=7, until=8)
def upsample_7(x: np.ndarray, *, scales: list[float], mode: str = "nearest") -> np.ndarray:
    return _upsample(x, list(scales), mode, "Upsample")


@kernel("Upsample", since=9)
def upsample_9(x: np.ndarray, scales: np.ndarray, *, mode: str = "nearest") -> np.ndarray:
    return _upsample(x, list(np.asarray(scales, dtype=np.float64).reshape(-1)), mode, "Upsample")
