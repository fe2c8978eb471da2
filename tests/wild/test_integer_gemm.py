"""MatMulInteger runs its integer product in float32 only where that is provably exact: both
sides of the bound (the float32 path, and a reduction long enough that float32 would round)
are checked against exact int64 arithmetic and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from anychip.backends.cpu.kernels.op_conv_integer import _exact_matmul
from tests.wild._compare import anychip_run, ort_run


def _model(k: int, n: int) -> onnx.ModelProto:
    node = h.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
    g = h.make_graph(
        [node],
        "g",
        [
            h.make_tensor_value_info("a", T.UINT8, [None, k]),
            h.make_tensor_value_info("b", T.INT8, [k, n]),
            h.make_tensor_value_info("za", T.UINT8, []),
            h.make_tensor_value_info("zb", T.INT8, []),
        ],
        [h.make_tensor_value_info("y", T.INT32, [None, n])],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


@pytest.mark.parametrize("k", [64, 4096])  # 64: float32 path; 4096: sums reach past 2**24
def test_matmul_integer_exact_on_both_sides_of_the_float32_bound(k: int) -> None:
    rng = np.random.default_rng(k)
    a = rng.integers(0, 256, (5, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (k, 7), dtype=np.int8)
    if k > 64:  # extremes everywhere, so the exact sums need more than float32's 24 bits
        a[:] = np.where(rng.random(a.shape) < 0.5, 0, 255).astype(np.uint8)
        b[:] = -128
    za, zb = np.uint8(3), np.int8(-2)
    feeds = {"a": a, "b": b, "za": np.array(za), "zb": np.array(zb)}
    want = (a.astype(np.int64) - 3) @ (b.astype(np.int64) + 2)
    assert (np.abs(want).max() >= 2**24) == (k > 64)
    got, _ = anychip_run(_model(k, 7), feeds)
    np.testing.assert_array_equal(got[0], want.astype(np.int32))
    np.testing.assert_array_equal(got[0], ort_run(_model(k, 7), feeds)[0])


def test_float32_would_round_past_the_bound() -> None:
    # The bound is what keeps results exact: a plain float32 product of these rounds.
    a = np.full((1, 2048), 255.0)
    b = np.full((2048, 1), 127.0)
    b[0, 0] = 128.0  # an odd total above 2**24: not a float32 integer
    exact = int(255 * 127 * 2048 + 255)
    assert float((a.astype(np.float32) @ b.astype(np.float32))[0, 0]) != exact
    assert int(_exact_matmul(a, b)[0, 0]) == exact
