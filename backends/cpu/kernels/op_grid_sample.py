"""GridSample (N-D; nearest, linear, cubic; zeros, border, reflection padding), AffineGrid,
and DeformConv, which samples its input at offset kernel taps the same way.

Sampling gathers from the flattened spatial axes once per interpolation tap (2**r taps for
linear, 4**r for cubic), each gather vectorised over batch, channels and sample points.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from anychip.backends.cpu.kernels._common import FLOAT_WITH_BF16, compute_dtype
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["grid_sample", "affine_grid", "deform_conv", "sample_points"]

_MODE_ALIASES = {"bilinear": "linear", "bicubic": "cubic"}


def _reflect(v: np.ndarray, twice_low: float, twice_high: float) -> np.ndarray:
    """Reflect coordinates into [twice_low / 2, twice_high / 2] until they are in bounds."""
    if twice_low == twice_high:
        return np.zeros_like(v)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    v = np.abs(v - low)
    extra = np.fmod(v, span)
    flips = np.floor(v / span)
    return np.where(flips % 2 == 0, extra + low, span - extra + low)


def _pad_coord(v: np.ndarray, size: int, padding: str, align_corners: int) -> np.ndarray:
    if padding == "border":
        return np.clip(v, 0, size - 1)
    if padding == "reflection":
        if align_corners:
            v = _reflect(v, 0, 2 * (size - 1))
        else:
            v = _reflect(v, -1, 2 * size - 1)
        return np.clip(v, 0, size - 1)
    return v


def _cubic_weights(t: np.ndarray, a: float = -0.75) -> list[np.ndarray]:
    """Weights of the taps at floor-1 .. floor+2 for fractional position ``t`` in [0, 1)."""

    def near(d: np.ndarray) -> np.ndarray:
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: np.ndarray) -> np.ndarray:
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def sample_points(
    x: np.ndarray,
    coords: np.ndarray,
    groups: int,
    *,
    mode: str = "linear",
    padding: str = "zeros",
    align_corners: int = 0,
) -> np.ndarray:
    """Interpolate ``x`` [N, C, *S] at ``coords`` [N, G, Q, r] (pixel units, S's axis order).

    Channels split into ``groups`` consecutive blocks, block g using coords[:, g].
    Returns [N, G, C/G, Q]. Taps outside the input are zero (padding 'zeros'); for border and
    reflection padding the coordinates (linear, nearest) or tap indices (cubic) are folded in.
    """
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    r = len(sizes)
    q = coords.shape[2]
    xg = x.reshape(n, groups, c // groups, math.prod(sizes))
    strides = [math.prod(sizes[a + 1 :]) for a in range(r)]
    out = np.zeros((n, groups, c // groups, q), dtype=x.dtype)
    pos = [coords[..., a] for a in range(r)]
    if mode in ("linear", "nearest"):
        pos = [_pad_coord(p, s, padding, align_corners) for p, s in zip(pos, sizes)]

    def add_tap(idx: list[np.ndarray], weight: np.ndarray) -> None:
        valid = np.ones(weight.shape, dtype=bool)
        flat = np.zeros(weight.shape, dtype=np.int64)
        for a, (i, s) in enumerate(zip(idx, sizes)):
            valid &= (i >= 0) & (i < s)
            flat += np.clip(i, 0, s - 1).astype(np.int64) * strides[a]
        vals = np.take_along_axis(xg, flat[:, :, None, :], axis=3)
        out[...] += vals * np.where(valid, weight, 0).astype(x.dtype)[:, :, None, :]

    if mode == "nearest":
        add_tap([np.rint(p) for p in pos], np.ones(pos[0].shape, dtype=x.dtype))
    elif mode == "linear":
        base = [np.floor(p) for p in pos]
        for corner in itertools.product((0, 1), repeat=r):
            idx = [b + o for b, o in zip(base, corner)]
            w = np.ones(pos[0].shape, dtype=x.dtype)
            for p, i in zip(pos, idx):
                w = w * (1 - np.abs(p - i))
            add_tap(idx, w)
    elif mode == "cubic":
        base = [np.floor(p) for p in pos]
        weights = [_cubic_weights(p - b) for p, b in zip(pos, base)]
        for taps in itertools.product(range(4), repeat=r):
            idx = []
            w = np.ones(pos[0].shape, dtype=x.dtype)
            for a, t in enumerate(taps):
                i = base[a] + (t - 1)
                if padding != "zeros":
                    i = np.rint(_pad_coord(i, sizes[a], padding, align_corners))
                idx.append(i)
                w = w * weights[a][t]
            add_tap(idx, w)
    else:
        raise ModelError(f"GridSample: mode must be linear, nearest or cubic, got {mode!r}")
    return out


@kernel("GridSample", since=16)
def grid_sample(
    x: np.ndarray,
    grid: np.ndarray,
    *,
    align_corners: int = 0,
    mode: str = "linear",
    padding_mode: str = "zeros",
) -> np.ndarray:
    mode = _MODE_ALIASES.get(mode, mode)
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ModelError(
            f"GridSample: padding_mode must be zeros, border or reflection, got {padding_mode!r}"
        )
    n = x.shape[0]
    sizes = x.shape[2:]
    r = len(sizes)
    if grid.shape[0] != n or grid.shape[-1] != r:
        raise ModelError(
            f"GridSample: grid {grid.shape} must be [N, *out, {r}] for input {x.shape}"
        )
    work = compute_dtype(x.dtype)
    g = grid.astype(np.float64).reshape(n, -1, r)[..., ::-1]  # innermost axis listed first
    size = np.asarray(sizes, dtype=np.float64)
    if align_corners:
        pix = (g + 1) / 2 * (size - 1)
    else:
        pix = ((g + 1) * size - 1) / 2
    out = sample_points(
        x.astype(np.float64),
        pix[:, None],
        1,
        mode=mode,
        padding=padding_mode,
        align_corners=align_corners,
    )
    return out.reshape((n, x.shape[1]) + grid.shape[1:-1]).astype(work).astype(x.dtype)


def _base_coords(n: int, align_corners: int) -> np.ndarray:
    if n <= 1:
        return np.zeros(max(n, 1))
    v = np.linspace(-1.0, 1.0, n)
    return v if align_corners else v * (n - 1) / n


@kernel("AffineGrid", since=20, dtypes=FLOAT_WITH_BF16)
def affine_grid(theta: np.ndarray, size: np.ndarray, *, align_corners: int = 0) -> np.ndarray:
    dims = [int(v) for v in np.asarray(size).reshape(-1)]
    spatial = dims[2:]
    r = len(spatial)
    if r not in (2, 3) or theta.shape[1:] != (r, r + 1):
        raise ModelError(
            f"AffineGrid: theta {theta.shape} and size {dims} must be (N, 2, 3) "
            "with (N, C, H, W) or (N, 3, 4) with (N, C, D, H, W)"
        )
    axes = [_base_coords(s, align_corners) for s in spatial]  # D?, H, W
    mesh = np.meshgrid(*axes, indexing="ij")
    # Homogeneous positions listed innermost first: (x, y[, z], 1).
    pts = np.stack([m for m in mesh[::-1]] + [np.ones_like(mesh[0])], axis=-1)
    work = compute_dtype(theta.dtype)
    out = np.einsum("...k,njk->n...j", pts.astype(work), theta.astype(work))
    return out.astype(theta.dtype)


@kernel("DeformConv", since=19, dtypes=FLOAT_WITH_BF16)
def deform_conv(
    x: np.ndarray,
    w: np.ndarray,
    offset: np.ndarray,
    b: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    *,
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    offset_group: int = 1,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    r = len(sizes)
    oc = w.shape[0]
    kshape = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    k = math.prod(kshape)
    dilations = list(dilations) if dilations else [1] * r
    strides = list(strides) if strides else [1] * r
    p = list(pads) if pads else [0] * (2 * r)
    out_sizes = [
        (s + p[a] + p[r + a] - ((kk - 1) * d + 1)) // st + 1
        for a, (s, kk, d, st) in enumerate(zip(sizes, kshape, dilations, strides))
    ]
    if c % group or c % offset_group or oc % group:
        raise ModelError(
            f"DeformConv: channels {c}/{oc} must be divisible by group={group} "
            f"and offset_group={offset_group}"
        )
    npos = math.prod(out_sizes)
    off = offset.astype(np.float64).reshape(n, offset_group, k, r, npos)
    # Regular sampling grid: output position * stride - pad + kernel offset * dilation.
    out_grid = np.stack(np.meshgrid(*[np.arange(o) for o in out_sizes], indexing="ij"), 0)
    out_grid = out_grid.reshape(r, npos)
    k_grid = np.stack(np.meshgrid(*[np.arange(kk) for kk in kshape], indexing="ij"), 0)
    k_grid = k_grid.reshape(r, k)
    base = (
        out_grid[:, None, :] * np.asarray(strides)[:, None, None]
        - np.asarray(p[:r])[:, None, None]
        + k_grid[:, :, None] * np.asarray(dilations)[:, None, None]
    )  # [r, K, P]
    coords = base.transpose(1, 0, 2)[None, None] + off  # [N, G, K, r, P]
    coords = coords.transpose(0, 1, 2, 4, 3).reshape(n, offset_group, k * npos, r)
    cols = sample_points(x.astype(np.float64), coords, offset_group)  # [N, G, C/G, K*P]
    cols = cols.reshape(n, c, k, npos)
    if mask is not None:
        m = mask.astype(np.float64).reshape(n, offset_group, 1, k, npos)
        cols = (cols.reshape(n, offset_group, c // offset_group, k, npos) * m).reshape(
            n, c, k, npos
        )
    cg = c // group
    cols = cols.reshape(n, group, cg * k, npos)
    wg = w.astype(np.float64).reshape(group, oc // group, cg * k)
    y = np.matmul(wg, cols).reshape((n, oc) + tuple(out_sizes))
    if b is not None:
        y = y + b.astype(np.float64).reshape((1, oc) + (1,) * r)
    return y.astype(compute_dtype(x.dtype)).astype(x.dtype)
