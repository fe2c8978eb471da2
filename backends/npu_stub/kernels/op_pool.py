"""MaxPool, AveragePool, GlobalAveragePool and ``anychip::NpuPool`` (2-D, NHWC windows)."""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder
from anychip.backends.npu_stub.kernels.geometry import explicit_pads, output_size, windows_nhwc

__all__ = ["pool_attributes", "pool2d_nhwc"]

_MODES = {"MaxPool": "max", "AveragePool": "average", "GlobalAveragePool": "global_average"}


def pool_attributes(node: Any, mode: str, in_hw: tuple[int, int]) -> dict:
    """Explicit geometry of a pooling node (``mode``: max, average, global_average)."""
    if mode == "global_average":
        return {"mode": mode}
    kernel = [int(k) for k in node.attr("kernel_shape")]
    strides = [int(s) for s in (node.attr("strides") or [1, 1])]
    dilations = [int(d) for d in (node.attr("dilations") or [1, 1])]
    pads = explicit_pads(
        in_hw, kernel, strides, dilations, node.attr("auto_pad", "NOTSET"), node.attr("pads")
    )
    ceil = bool(node.attr("ceil_mode", 0))
    out_hw = tuple(
        output_size(in_hw[i], kernel[i], strides[i], dilations[i], pads[i], pads[i + 2], ceil)
        for i in range(2)
    )
    return {
        "mode": mode,
        "kernel": kernel,
        "strides": strides,
        "dilations": dilations,
        "pads": pads,
        "ceil_mode": int(ceil),
        "count_include_pad": int(node.attr("count_include_pad", 0)),
        "out_hw": out_hw,
    }


def pool2d_nhwc(x: np.ndarray, geo: dict) -> np.ndarray:
    """Pool NHWC ``x``; returns NHWC float32."""
    mode = geo["mode"]
    if mode == "global_average":
        return x.mean(axis=(1, 2), keepdims=True, dtype=np.float32)
    args = (geo["kernel"], geo["strides"], geo["dilations"], geo["pads"], geo["out_hw"])
    if mode == "max":
        return windows_nhwc(x, *args, fill=-np.inf).max(axis=(4, 5))
    total = windows_nhwc(x, *args).sum(axis=(4, 5), dtype=np.float32)
    # Divide by the elements under each window: the real ones, and with count_include_pad
    # the explicit padding too, never the cells a ceil_mode window runs past the padding
    # (onnxruntime's divisor). Without ceil_mode overhang this is the kernel's area.
    pt, pl, pb, pr = geo["pads"]
    if geo["count_include_pad"]:
        ones = np.ones((1, x.shape[1] + pt + pb, x.shape[2] + pl + pr, 1), np.float32)
        count_args = (*args[:3], [0, 0, 0, 0], args[4])
    else:
        ones = np.ones((1, x.shape[1], x.shape[2], 1), np.float32)
        count_args = args
    count = windows_nhwc(ones, *count_args).sum(axis=(4, 5), dtype=np.float32)
    return total / count


@builder("MaxPool", "AveragePool", "GlobalAveragePool")
@builder("NpuPool", domain="anychip")
def build_pool(node: Any, ctx: Any) -> Run:
    nhwc = node.attr("layout", "NCHW") == "NHWC"
    mode = node.attr("mode") if node.op_type == "NpuPool" else _MODES[node.op_type]
    shape = node.inputs[0].shape
    in_hw = tuple(shape[1:3]) if nhwc else tuple(shape[2:4])
    geo = pool_attributes(node, mode, in_hw)
    out = node.outputs[0].shape
    if "out_hw" in geo and out is not None and all(isinstance(d, int) for d in out):
        # ONNX's shape inference and its reference disagree on some ceil_mode windows; the
        # graph's static shape is what every other node was planned with, so it wins.
        geo["out_hw"] = tuple(out[1:3]) if nhwc else tuple(out[2:4])

    def run(xs: list) -> np.ndarray:
        x = xs[0] if nhwc else xs[0].transpose(0, 2, 3, 1)
        y = pool2d_nhwc(x, geo)
        return y if nhwc else y.transpose(0, 3, 1, 2)

    return run
