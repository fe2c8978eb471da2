"""Sliding-window geometry: the ``auto_pad``/``pads``/``strides``/``dilations``/``ceil_mode``
attributes of ONNX's Conv and pooling ops turned into begin/end pads and output sizes, written
once for every backend (the CPU's numpy and oneDNN kernels, OpenCL's), so they agree on every
output shape by construction.

``window_geometry`` raises ``KernelError`` with the op's name for a kernel of the wrong rank, a
window larger than the padded input or an unknown ``auto_pad``.
"""

from __future__ import annotations

from anychip.errors import KernelError

__all__ = ["Geometry", "window_geometry"]


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
