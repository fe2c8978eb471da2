"""Resize (opset 11 on): ``nearest`` and ``linear`` over any axes, as onnxruntime computes
them (its coordinate arithmetic in float32, its clamping and its rounding rules).

The output shape is the graph's (static shapes: the runtime traces each signature), so
``sizes`` is never read; ``scales``, when given, steers the coordinate transform (a constant
one is read once at compile time, a computed one on each run). Linear is separable: one
two-tap blend per resized axis, with onnxruntime's weights (both 0.5 where the two taps are
the same clamped index, so a NaN or Inf neighbour spreads as in its kernel). For a 4-D input
whose N and C keep their size, H and W are both interpolated even when one keeps its size
(onnxruntime's bilinear path does, and its zero weights carry a NaN or Inf neighbour along).
What ``check_node`` refuses: cubic, ``tf_crop_and_resize``, antialias, a
``keep_aspect_ratio_policy`` other than ``stretch``, opsets before 11.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder

__all__ = ["RESIZE_MODES", "RESIZE_COORDINATES", "RESIZE_NEAREST"]

RESIZE_MODES = ("nearest", "linear")
RESIZE_COORDINATES = (
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "half_pixel_symmetric",
)
RESIZE_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_F = np.float32


def _original(coord: str, n_out: int, n_in: int, scale: np.float32) -> np.ndarray:
    """The input coordinate of each output index along one axis (float32, unclamped)."""
    x = np.arange(n_out, dtype=_F)
    if coord == "half_pixel":
        return (x + _F(0.5)) / scale - _F(0.5)
    if coord == "pytorch_half_pixel":
        return (x + _F(0.5)) / scale - _F(0.5) if n_out > 1 else np.zeros(n_out, _F)
    if coord == "align_corners":
        if n_out == 1:
            return np.zeros(1, _F)
        return x * _F(n_in - 1) / _F(n_out - 1)
    if coord == "asymmetric":
        return x / scale
    if coord == "tf_half_pixel_for_nn":
        return (x + _F(0.5)) / scale
    # half_pixel_symmetric
    adjustment = _F(n_out) / (scale * _F(n_in))
    offset = _F(n_in) / _F(2) * (_F(1) - adjustment)
    return offset + (x + _F(0.5)) / scale - _F(0.5)


def _nearest_index(x: np.ndarray, rule: str, n_in: int) -> np.ndarray:
    if rule == "floor":
        i = np.floor(x)
    elif rule == "ceil":
        i = np.ceil(x)
    elif rule == "round_prefer_ceil":
        i = np.floor(x + _F(0.5))
    else:  # round_prefer_floor
        i = np.ceil(x - _F(0.5))
    return np.clip(i.astype(np.int64), 0, n_in - 1)


def _linear_axis(y: np.ndarray, axis: int, x: np.ndarray) -> np.ndarray:
    n_in = y.shape[axis]
    x = np.clip(x, _F(0), _F(n_in - 1))
    i0 = np.minimum(x.astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = np.abs(x - i0.astype(_F))  # onnxruntime's dx1: the weight of the far tap
    w0 = np.abs(x - i1.astype(_F))
    same = i0 == i1
    w0, w1 = np.where(same, _F(0.5), w0), np.where(same, _F(0.5), w1)
    shape = [1] * y.ndim
    shape[axis] = -1
    a, b = np.take(y, i0, axis=axis), np.take(y, i1, axis=axis)
    return a * w0.reshape(shape) + b * w1.reshape(shape)


@builder("Resize")
def build_resize(node: Any, ctx: Any) -> Run:
    in_shape = tuple(int(d) for d in node.inputs[0].shape)
    out_shape = tuple(int(d) for d in node.outputs[0].shape)
    rank = len(in_shape)
    mode = node.attr("mode", "nearest")
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    rule = node.attr("nearest_mode", "round_prefer_floor")
    axes = [int(a) + rank if int(a) < 0 else int(a) for a in (node.attr("axes") or range(rank))]
    scales_v = node.inputs[2] if len(node.inputs) > 2 else None
    for i in (1, 3):  # roi (tf_crop_and_resize only, refused) and sizes: the shape is static
        if len(node.inputs) > i and node.inputs[i] is not None and node.inputs[i].const is not None:
            ctx.const(node.inputs[i])
    fixed_scales = None
    if scales_v is not None and scales_v.const is not None:
        fixed_scales = ctx.const(scales_v)
    interpolate = [i for i in range(rank) if in_shape[i] != out_shape[i]]
    if mode == "linear" and rank == 4 and not {0, 1} & set(interpolate):
        interpolate = [2, 3]  # onnxruntime's bilinear path

    def scales_of(xs: list) -> np.ndarray:
        given = fixed_scales
        if given is None and scales_v is not None and xs[2] is not None:
            given = xs[2]
        if given is not None and given.size:
            full = np.ones(rank, _F)
            full[axes] = np.asarray(given, _F).reshape(-1)
            return full
        return np.array([_F(o) / _F(i) for o, i in zip(out_shape, in_shape)], _F)

    def run(xs: list) -> np.ndarray:
        scales = scales_of(xs)
        y = xs[0]
        for axis in interpolate:
            x = _original(coord, out_shape[axis], in_shape[axis], scales[axis])
            if mode == "nearest":
                y = np.take(y, _nearest_index(x, rule, in_shape[axis]), axis=axis)
            else:
                y = _linear_axis(y, axis, x)
        return y

    return run
