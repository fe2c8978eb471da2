"""QLinearConv and ConvInteger accumulate exactly on each of their paths: numpy's float32 Conv
(small, under the 2**24 bound), oneDNN's float32 direct convolution (at least ``MIN_MACS``
multiply-adds, under the bound) and float64 (past the bound), against int64 arithmetic and
onnxruntime, on seeded random u8s8 and s8s8 weights, per tensor and per channel."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from anychip.backends.cpu.kernels import op_conv_integer
from anychip.backends.cpu.kernels.op_conv_integer import _EXACT_F32
from anychip.backends.cpu.onednn._lib import get
from tests.wild._compare import anychip_run, ort_run

_ONNX_TYPE = {np.dtype(np.uint8): T.UINT8, np.dtype(np.int8): T.INT8}


def _int_conv(x: np.ndarray, w: np.ndarray, pads: int, stride: int, group: int) -> np.ndarray:
    """The exact convolution of int64 arrays (x already centered: padding is zero)."""
    x = np.pad(x, [(0, 0), (0, 0), (pads, pads), (pads, pads)])
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    win = win[:, :, ::stride, ::stride]
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    win = win.reshape(n, group, cg, *win.shape[2:])
    wg = w.reshape(group, m // group, cg, kh, kw)
    y = np.einsum("ngchwij,gmcij->ngmhw", win, wg)
    return y.reshape(n, m, *y.shape[-2:])


def _qlinear_conv_model(xt: np.dtype, w: np.ndarray, wz: np.ndarray, ws: np.ndarray, b, attrs):
    inits = [
        nh.from_array(np.array(0.02, np.float32), "xs"),
        nh.from_array(np.array(3 if xt == np.uint8 else -5, xt), "xz"),
        nh.from_array(w, "w"),
        nh.from_array(ws, "ws"),
        nh.from_array(wz, "wz"),
        nh.from_array(np.array(0.37, np.float32), "ys"),
        nh.from_array(np.array(120 if xt == np.uint8 else 2, xt), "yz"),
        nh.from_array(b, "b"),
    ]
    node = h.make_node(
        "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], **attrs
    )
    g = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("x", _ONNX_TYPE[np.dtype(xt)], None)],
        [h.make_tensor_value_info("y", _ONNX_TYPE[np.dtype(xt)], None)],
        inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


# (activation type, per channel, input shape, out channels, group, stride): the first two
# run numpy's float32 Conv (under MIN_MACS), the last two oneDNN's.
CASES = [
    (np.uint8, False, (2, 8, 16, 16), 8, 1, 1),
    (np.int8, True, (1, 6, 9, 11), 4, 2, 2),
    (np.uint8, True, (2, 16, 32, 32), 16, 1, 1),
    (np.int8, False, (2, 16, 48, 47), 32, 2, 2),
]


@pytest.mark.parametrize("xt, per_channel, shape, m, group, stride", CASES)
def test_qlinear_conv_matches_int64_and_onnxruntime(
    xt, per_channel, shape, m, group, stride, monkeypatch
):
    ran = []  # what oneDNN's convolution gave: None when it declined
    real_conv = op_conv_integer.onednn_conv.conv

    def spy(*args, **kwargs):
        ran.append(real_conv(*args, **kwargs))
        return ran[-1]

    monkeypatch.setattr(op_conv_integer.onednn_conv, "conv", spy)
    rng = np.random.default_rng(sum(shape) + m)
    info = np.iinfo(xt)
    x = rng.integers(info.min, info.max + 1, shape, dtype=xt)
    w = rng.integers(-127, 128, (m, shape[1] // group, 3, 3), dtype=np.int8)
    nz = m if per_channel else 1
    wz = np.zeros(nz, np.int8) if per_channel else np.array(0, np.int8)
    ws = (rng.random(nz) * 0.01 + 0.001).astype(np.float32)
    ws = ws if per_channel else ws.reshape(())
    b = rng.integers(-5000, 5000, m).astype(np.int32)
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride], "group": group}
    model = _qlinear_conv_model(xt, w, wz, ws, b, attrs)
    xz = 3 if xt == np.uint8 else -5
    acc = _int_conv(x.astype(np.int64) - xz, w.astype(np.int64), 1, stride, group)
    acc = acc + b.reshape(1, -1, 1, 1)
    scale = ws.astype(np.float64).reshape(-1, 1, 1) if per_channel else float(ws)
    real = acc * np.float64(np.float32(0.02)) * scale / np.float64(np.float32(0.37))
    want = np.clip(np.rint(real) + (120 if xt == np.uint8 else 2), info.min, info.max)
    got, _ = anychip_run(model, {"x": x})
    np.testing.assert_array_equal(got[0], want.astype(xt))
    if get() is not None:  # the path the case is meant to take
        assert [r is not None for r in ran] == ([True] if shape[1] == 16 else [])
    # onnxruntime requantizes in float32: at most one step apart.
    ref = ort_run(model, {"x": x})[0]
    assert np.abs(got[0].astype(np.int32) - ref.astype(np.int32)).max() <= 1


def _conv_integer_model(w: np.ndarray, wz: int) -> onnx.ModelProto:
    node = h.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1])
    g = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("x", T.UINT8, None)],
        [h.make_tensor_value_info("y", T.INT32, None)],
        [
            nh.from_array(w, "w"),
            nh.from_array(np.array(7, np.uint8), "xz"),
            nh.from_array(np.array(wz, np.uint8), "wz"),
        ],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


@pytest.mark.parametrize("c", [16, 256])  # 16: float32 (oneDNN); 256: sums past 2**24
def test_conv_integer_exact_on_both_sides_of_the_float32_bound(c: int) -> None:
    rng = np.random.default_rng(c)
    x = rng.integers(0, 256, (2, c, 24, 24), dtype=np.uint8)
    w = rng.integers(0, 256, (8, c, 3, 3), dtype=np.uint8)
    if c > 16:  # extremes, so the exact sums need more than float32's 24 bits
        x[:] = np.where(rng.random(x.shape) < 0.5, 0, 255).astype(np.uint8)
        w[:] = 255
    want = _int_conv(x.astype(np.int64) - 7, w.astype(np.int64) - 1, 1, 1, 1)
    assert (np.abs(want).max() >= _EXACT_F32) == (c > 16)
    model = _conv_integer_model(w, 1)
    got, _ = anychip_run(model, {"x": x})
    np.testing.assert_array_equal(got[0], want.astype(np.int32))
    np.testing.assert_array_equal(got[0], ort_run(model, {"x": x})[0])
