"""Gather's indices: every index of [-dim, dim) along any axis against onnxruntime on seeded
random data, and one index past either end a clear error naming the range (np.take checks
the bounds; no min/max passes)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from anychip.backends.cpu.kernels.op_gather import gather
from anychip.errors import AnychipError


def _ort(data: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    node = helper.make_node("Gather", ["d", "i"], ["y"], axis=axis)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, data.shape),
         helper.make_tensor_value_info("i", TensorProto.INT64, idx.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"d": data, "i": idx})[0]


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_every_index_in_range_equals_onnxruntime(axis):
    rng = np.random.default_rng(axis + 3)
    data = rng.standard_normal((4, 5, 6)).astype(np.float32)
    dim = data.shape[axis]
    idx = rng.permutation(np.arange(-dim, dim, dtype=np.int64)).reshape(2, dim)
    np.testing.assert_array_equal(gather(data, idx, axis=axis), _ort(data, idx, axis))


@pytest.mark.parametrize("bad", [-6, 5])
def test_an_index_past_either_end_is_named(bad):
    data = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    idx = np.array([[0, bad], [1, 2]], np.int64)
    with pytest.raises(AnychipError, match=r"\[-5, 4\].*min .*max"):
        gather(data, idx, axis=0)
