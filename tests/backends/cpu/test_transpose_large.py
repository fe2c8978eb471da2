"""Large transposes that move the last axis: copied by oneDNN's reorder (float32) or in tiles
(other dtypes, or without oneDNN), equal to onnxruntime's; numpy's own copy reads a
power-of-two row stride into a few cache sets (1024 x 1024 float32: 7 ms, 10x the 1000 x 1000)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.backends.cpu.kernels import op_transpose as T

CASES = [
    ((1024, 1024), (1, 0)),
    ((3, 512, 200), (0, 2, 1)),
    ((2, 4, 256, 130), (0, 1, 3, 2)),
    ((2, 130, 20, 140), (3, 0, 2, 1)),
]


def _model(shape: tuple, perm: tuple, elem: int) -> bytes:
    g = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], perm=list(perm))], "g",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", elem, None)],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("shape,perm", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_large_transposes_equal_onnxruntime(shape, perm, dtype) -> None:
    elem = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}.get(
        dtype, TensorProto.INT32
    )
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    m = _model(shape, perm, elem)
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = anychip.load(m, devices=["cpu"]).run(None, {"x": x})[0]
    assert got.flags.c_contiguous and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,perm", CASES)
def test_the_tiled_copy_and_the_reorder_write_every_element(shape, perm) -> None:
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    want = np.ascontiguousarray(np.transpose(x, perm))
    view = np.transpose(x, perm)
    out = np.full(want.shape, np.nan, np.float32)  # an element left unwritten shows
    tiled = T._tiled_copy(view, out)
    assert tiled is out
    np.testing.assert_array_equal(tiled, want)
    from anychip.backends.cpu import onednn

    if onednn.available():
        out2 = np.full(want.shape, np.nan, np.float32)
        assert T._onednn_copy(x, view, out2) is out2
        np.testing.assert_array_equal(out2, want)


def test_a_transpose_keeping_the_last_axis_is_not_tiled() -> None:
    x = np.zeros((64, 300, 40), np.float32)
    assert T._tiled_copy(np.transpose(x, (1, 0, 2)), None) is None
