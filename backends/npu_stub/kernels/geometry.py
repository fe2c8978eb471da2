"""Sliding-window geometry shared by convolutions, pools and the passes that rewrite them.

All functions work on the two spatial dimensions (the NPU runs 2-D windows only) and return
plain ints, so a pass can write explicit pads into a node and the kernel never sees
``auto_pad``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["explicit_pads", "output_size", "windows_nhwc"]


def explicit_pads(
    in_sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str,
    pads: Sequence[int] | None,
) -> list[int]:
    """ONNX pads ``[top, left, bottom, right]`` with ``auto_pad`` resolved (static shapes)."""
    if auto_pad == "VALID":
        return [0, 0, 0, 0]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else big)
            ends.append(big if auto_pad == "SAME_UPPER" else small)
        return begins + ends
    return [int(p) for p in pads] if pads else [0, 0, 0, 0]


def output_size(
    size: int, k: int, s: int, d: int, pad_begin: int, pad_end: int, ceil_mode: bool = False
) -> int:
    """Output length of one spatial axis (ONNX's formula, as its shape inference applies it)."""
    span = size + pad_begin + pad_end - (k - 1) * d - 1
    if not ceil_mode:
        return span // s + 1
    return -(-span // s) + 1


def windows_nhwc(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
    out_hw: Sequence[int],
    fill: float = 0.0,
) -> np.ndarray:
    """A ``[N, OH, OW, C, KH, KW]`` strided view of the windows of NHWC ``x`` (no copy of
    the windows; the padded input is one copy when padding is needed)."""
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilations
    oh, ow = out_hw
    pt, pl, pb, pr = pads
    # Extra trailing rows/cols for ceil_mode windows that run past the padded input.
    need_h = (oh - 1) * sh + (kh - 1) * dh + 1
    need_w = (ow - 1) * sw + (kw - 1) * dw + 1
    eb = max(0, need_h - (x.shape[1] + pt + pb))
    er = max(0, need_w - (x.shape[2] + pl + pr))
    if pt or pb or pl or pr or eb or er:
        x = np.pad(x, ((0, 0), (pt, pb + eb), (pl, pr + er), (0, 0)), constant_values=fill)
    span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    win = sliding_window_view(x, span, axis=(1, 2))
    return win[:, : (oh - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw, :, ::dh, ::dw]
