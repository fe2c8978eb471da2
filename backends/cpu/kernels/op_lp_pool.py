"""LpPool: the p-norm of every window, (sum |x|^p)^(1/p), with zero padding.

Opset 1 takes ``p`` as a float, later opsets as an int; opset 18 adds dilations and
ceil_mode. Window geometry comes from the shared sliding-window helper.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import FLOAT_WITH_BF16, compute_dtype
from anychip.backends.cpu.kernels._window import pad_spatial, window_view
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError
from anychip.ir.window import window_geometry

__all__ = ["lp_pool"]


@kernel("LpPool", since=1, dtypes=FLOAT_WITH_BF16)
def lp_pool(
    x: np.ndarray,
    *,
    kernel_shape: list[int],
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    p: float = 2,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    if x.ndim < 3:
        raise ModelError(f"LpPool: input must be [N, C, *spatial], got shape {x.shape}")
    g = window_geometry(
        x.shape[2:],
        list(kernel_shape),
        strides=strides,
        dilations=dilations,
        pads=pads,
        auto_pad=auto_pad,
        ceil_mode=ceil_mode,
        op="LpPool",
    )
    work = compute_dtype(x.dtype)
    xp = pad_spatial(np.abs(x.astype(work)), g, 0)
    view = window_view(xp, g, lead=2, kernel_first=False)  # [N, C, *out, *kernel]
    axes = tuple(range(2 + len(g.out), view.ndim))
    pw = float(p)
    out = np.power(np.sum(np.power(view, pw), axis=axes), 1.0 / pw)
    return out.astype(x.dtype)
