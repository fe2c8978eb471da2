"""Conv and the fused ``anychip::NpuConv``: NHWC im2col + one (batched) matmul per call.

Weights are packed once, at compile time, into ``[group, KH*KW*C/group, M/group]`` (the
column order of the im2col matrix) and stored in device memory, as float16 in fp16 mode.
An NCHW node transposes at its edges; the layout pass removes those transposes between NPU ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder, round_fp16
from anychip.backends.npu_stub.kernels.geometry import explicit_pads, output_size, windows_nhwc
from anychip.errors import UnsupportedOpError

__all__ = ["conv_attributes", "pack_conv_weights", "conv2d_nhwc", "activation_fn"]


def conv_attributes(node: Any, in_hw: tuple[int, int], w_shape: tuple[int, ...]) -> dict:
    """Explicit 2-D geometry of a Conv/NpuConv node: kernel, strides, dilations, pads, group."""
    kernel = [int(k) for k in (node.attr("kernel_shape") or w_shape[2:])]
    strides = [int(s) for s in (node.attr("strides") or [1, 1])]
    dilations = [int(d) for d in (node.attr("dilations") or [1, 1])]
    pads = explicit_pads(
        in_hw, kernel, strides, dilations, node.attr("auto_pad", "NOTSET"), node.attr("pads")
    )
    return {
        "kernel": kernel,
        "strides": strides,
        "dilations": dilations,
        "pads": pads,
        "group": int(node.attr("group", 1)),
    }


def pack_conv_weights(w: np.ndarray, group: int) -> np.ndarray:
    """ONNX ``[M, C/g, KH, KW]`` weights as ``[g, KH*KW*C/g, M/g]`` matmul operands."""
    m, cg, kh, kw = w.shape
    packed = w.reshape(group, m // group, cg, kh, kw).transpose(0, 3, 4, 2, 1)
    return np.ascontiguousarray(packed.reshape(group, kh * kw * cg, m // group))


def activation_fn(name: str, params: list[float]) -> Callable[[np.ndarray], np.ndarray] | None:
    """The fused activation applied in place to the conv result (None: no activation)."""
    if not name:
        return None
    if name == "Relu":
        return lambda y: np.maximum(y, 0, out=y)
    if name == "Clip":
        lo, hi = (list(params) + [-np.inf, np.inf])[:2] if params else (-np.inf, np.inf)
        return lambda y: np.clip(y, lo, hi, out=y)
    raise ValueError(f"unknown fused activation {name!r}")


def conv2d_nhwc(
    x: np.ndarray, packed: np.ndarray, bias: np.ndarray | None, geo: dict, out_hw: tuple
) -> np.ndarray:
    """Convolution of NHWC ``x`` with packed weights; returns NHWC float32."""
    n, _, _, c = x.shape
    g = geo["group"]
    kh, kw = geo["kernel"]
    oh, ow = out_hw
    rows = n * oh * ow
    simple = (kh, kw) == (1, 1) and geo["strides"] == [1, 1] and not any(geo["pads"])
    if simple:
        cols = x.reshape(rows, c)
    else:
        win = windows_nhwc(x, geo["kernel"], geo["strides"], geo["dilations"], geo["pads"], out_hw)
        cols = win.transpose(0, 1, 2, 4, 5, 3).reshape(rows, kh * kw * c)
    if g == 1:
        y = cols @ packed[0]
    else:
        cg = c // g
        grouped = cols.reshape(rows, kh * kw, g, cg).transpose(2, 0, 1, 3)
        y = np.matmul(grouped.reshape(g, rows, kh * kw * cg), packed)
        y = y.transpose(1, 0, 2).reshape(rows, -1)
    if bias is not None:
        y += bias
    return y.reshape(n, oh, ow, -1)


@builder("Conv")
@builder("NpuConv", domain="anychip")
def build_conv(node: Any, ctx: Any) -> Run:
    x, w = node.inputs[0], node.inputs[1]
    if len(x.shape) != 4:  # a 1-D Conv reaches the compiler lowered (passes/lower_conv1d.py)
        raise UnsupportedOpError(
            f"npu: Conv {node.name!r} over {x.type_str()} was not lowered to 2-D: run the "
            "NPU's passes (npu_passes()) before compiling"
        )
    b = node.inputs[2] if len(node.inputs) > 2 else None
    nhwc = node.attr("layout", "NCHW") == "NHWC"
    in_hw = tuple(x.shape[1:3]) if nhwc else tuple(x.shape[2:4])
    geo = conv_attributes(node, in_hw, w.shape)
    out_hw = tuple(
        output_size(
            in_hw[i],
            geo["kernel"][i],
            geo["strides"][i],
            geo["dilations"][i],
            geo["pads"][i],
            geo["pads"][i + 2],
        )
        for i in range(2)
    )
    fp16 = ctx.fp16
    wdtype = np.float16 if fp16 else np.float32
    group = geo["group"]
    wref = (
        ctx.weight(w, pack=lambda a: pack_conv_weights(a, group), dtype=wdtype)
        if (w.const is not None)
        else None
    )
    bref = ctx.weight(b) if b is not None and b.const is not None else None
    act = activation_fn(node.attr("activation", ""), node.attr("activation_params") or [])

    def run(xs: list) -> np.ndarray:
        xa = xs[0] if nhwc else xs[0].transpose(0, 2, 3, 1)
        if fp16:
            xa = round_fp16(xa)
        packed = wref.array if wref is not None else pack_conv_weights(xs[1], group)
        if fp16:
            packed = packed.astype(np.float32) if wref is not None else round_fp16(packed)
        bias = bref.array if bref is not None else (xs[2] if b is not None else None)
        y = conv2d_nhwc(xa, packed, bias, geo, out_hw)
        if act is not None:
            act(y)
        return y if nhwc else y.transpose(0, 3, 1, 2)

    return run
