"""Sliding-window geometry shared by Conv and the pooling kernels (not a kernel module).

``window_geometry`` turns ONNX's auto_pad/pads/strides/dilations/ceil_mode attributes into
begin/end pads and output sizes; ``window_view`` gives a zero-copy strided view of every
window so kernels do im2col with one reshape or reduce with one loop over kernel offsets.
"""

from __future__ import annotations

import numpy as np

from anychip.errors import KernelError

__all__ = ["Geometry", "window_geometry", "pad_spatial", "window_view"]


class Geometry:
    """Per spatial axis: pads before/after (extra_end: ceil_mode slack) and output sizes."""

    __slots__ = ("begin", "end", "extra_end", "out", "kernel", "strides", "dilations")

    def __init__(
        self,
        begin: list[int],
        end: list[int],
        extra_end: list[int],
        out: list[int],
        kernel: list[int],
        strides: list[int],
        dilations: list[int],
    ) -> None:
        self.begin = begin
        self.end = end
        self.extra_end = extra_end
        self.out = out
        self.kernel = kernel
        self.strides = strides
        self.dilations = dilations


def window_geometry(
    spatial: tuple[int, ...],
    kernel: list[int],
    *,
    strides: list[int] | None,
    dilations: list[int] | None,
    pads: list[int] | None,
    auto_pad: str,
    ceil_mode: int = 0,
    op: str = "Conv",
) -> Geometry:
    """Output sizes and pads for windows of ``kernel`` over ``spatial`` (ONNX rules)."""
    nd = len(spatial)
    if len(kernel) != nd:
        raise KernelError(
            f"{op}: kernel_shape {kernel} has {len(kernel)} axes but the input "
            f"has {nd} spatial axes"
        )
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    begin, end, extra, out = [0] * nd, [0] * nd, [0] * nd, [0] * nd
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(nd):
            out[i] = -(-spatial[i] // strides[i])
            total = max(0, (out[i] - 1) * strides[i] + eff[i] - spatial[i])
            small = total // 2
            begin[i] = small if auto_pad == "SAME_UPPER" else total - small
            end[i] = total - begin[i]
    elif auto_pad in ("NOTSET", "VALID", ""):
        if auto_pad == "NOTSET" and pads:
            begin, end = list(pads[:nd]), list(pads[nd:])
        for i in range(nd):
            span = spatial[i] + begin[i] + end[i] - eff[i]
            if span < 0:
                raise KernelError(
                    f"{op}: window of size {eff[i]} (with dilation) is larger "
                    f"than padded input axis {i} of size "
                    f"{spatial[i] + begin[i] + end[i]}"
                )
            if ceil_mode:
                out[i] = -(-span // strides[i]) + 1
                # The last window must start inside the input or the begin padding.
                if (out[i] - 1) * strides[i] >= spatial[i] + begin[i]:
                    out[i] -= 1
            else:
                out[i] = span // strides[i] + 1
            need = (out[i] - 1) * strides[i] + eff[i] - (spatial[i] + begin[i] + end[i])
            extra[i] = max(0, need)
    else:
        raise KernelError(
            f"{op}: unknown auto_pad {auto_pad!r}; use NOTSET, SAME_UPPER, SAME_LOWER or VALID"
        )
    return Geometry(begin, end, extra, out, list(kernel), strides, dilations)


def pad_spatial(
    x: np.ndarray, g: Geometry, value: float | int, *, with_extra: bool = True
) -> np.ndarray:
    """``x`` padded on its spatial axes (2..) by the geometry's pads, with ``value``."""
    ends = [e + (x_ if with_extra else 0) for e, x_ in zip(g.end, g.extra_end)]
    if not any(g.begin) and not any(ends):
        return x
    if min(g.begin) < 0 or min(ends) < 0:
        width = [(0, 0), (0, 0)] + list(zip(g.begin, ends))
        return np.pad(x, width, mode="constant", constant_values=value)
    # Filled and copied by hand: np.pad's Python cost (about 20 us) exceeded the pooling of a
    # small feature map.
    spatial = x.shape[2:]
    shape = x.shape[:2] + tuple(s + b + e for s, b, e in zip(spatial, g.begin, ends))
    xp = np.zeros(shape, x.dtype) if value == 0 else np.full(shape, value, x.dtype)
    inner = tuple(slice(b, b + s) for b, s in zip(g.begin, spatial))
    xp[(slice(None), slice(None)) + inner] = x
    return xp


def window_view(
    xp: np.ndarray, g: Geometry, lead: int = 2, kernel_first: bool = True
) -> np.ndarray:
    """A read-only view of shape ``lead dims + kernel + out`` (or ``+ out + kernel``).

    ``xp`` is already padded; its first ``lead`` axes are kept as they are.
    """
    st = xp.strides
    sp = st[lead:]
    k_shape = tuple(g.kernel)
    k_strides = tuple(s * d for s, d in zip(sp, g.dilations))
    o_shape = tuple(g.out)
    o_strides = tuple(s * t for s, t in zip(sp, g.strides))
    if kernel_first:
        shape = xp.shape[:lead] + k_shape + o_shape
        strides = st[:lead] + k_strides + o_strides
    else:
        shape = xp.shape[:lead] + o_shape + k_shape
        strides = st[:lead] + o_strides + k_strides
    if not xp.flags.c_contiguous:
        return np.lib.stride_tricks.as_strided(xp, shape=shape, strides=strides, writeable=False)
    # np.ndarray over the buffer: as_strided's wrapper costs about 8 us a call.
    view = np.ndarray(shape, xp.dtype, buffer=xp, strides=strides)
    view.flags.writeable = False
    return view
