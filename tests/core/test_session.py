"""``core/api/session.py``, the facade: runs and its errors (feeds, outputs, files, options)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import anychip


def _model(op: str = "Relu", domain: str = "") -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], name="n0", domain=domain)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    opsets = [helper.make_opsetid("", 17)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(g, opset_imports=opsets)


@pytest.fixture(scope="module")
def sess():
    return anychip.load(_model(), devices=["cpu"])


def test_runs(sess):
    x = np.array([[-1, 0, 2]], np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, [[0, 0, 2]])
    assert [i.name for i in sess.inputs] == ["x"]
    assert sess.inputs[0].shape == ["batch", 3]


def test_missing_feed(sess):
    with pytest.raises(anychip.InputError, match=r"missing input 'x'.*f32\[batch,3\]"):
        sess.run(None, {})


def test_unknown_feed(sess):
    with pytest.raises(anychip.InputError, match=r"unknown input 'z'.*\['x'\]"):
        sess.run(None, {"x": np.zeros((1, 3), np.float32), "z": np.zeros(1)})


def test_wrong_dtype(sess):
    with pytest.raises(anychip.InputError, match=r"'x' expects dtype float32.*got float64.*astype"):
        sess.run(None, {"x": np.zeros((1, 3))})


def test_wrong_rank(sess):
    with pytest.raises(anychip.InputError, match=r"'x' expects rank 2.*got rank 1"):
        sess.run(None, {"x": np.zeros(3, np.float32)})


def test_wrong_static_dim(sess):
    with pytest.raises(anychip.InputError, match=r"dimension 1 is 4, expected 3"):
        sess.run(None, {"x": np.zeros((2, 4), np.float32)})


def test_unknown_output_name(sess):
    with pytest.raises(anychip.InputError, match=r"unknown output 'q'"):
        sess.run(["q"], {"x": np.zeros((1, 3), np.float32)})


def test_feeds_not_a_dict(sess):
    with pytest.raises(anychip.InputError, match="dict"):
        sess.run(None, [np.zeros((1, 3), np.float32)])


def test_unsupported_op_names_node_and_domain():
    with pytest.raises(anychip.UnsupportedOpError, match=r"com\.nowhere"):
        anychip.load(_model("Frobnicate", "com.nowhere"), devices=["cpu"])


def test_truncated_model_file(tmp_path):
    data = _model().SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(anychip.ModelError, match="m.onnx"):
        anychip.load(str(path), devices=["cpu"])


def test_missing_model_file(tmp_path):
    with pytest.raises(anychip.ModelError, match="nothere.onnx"):
        anychip.load(str(tmp_path / "nothere.onnx"))


def test_unknown_load_option():
    with pytest.raises(anychip.AnychipError, match="unknown load option"):
        anychip.load(_model(), devices=["cpu"], fast=True)


def test_kernel_failure_names_node():
    g = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        "g",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", "k"]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["k2", "n"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", "n"])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = anychip.load(m, devices=["cpu"])
    with pytest.raises(anychip.KernelError, match=r"(?s)node .mm. \(MatMul\).*float32\[2, 3\]"):
        sess.run(None, {"a": np.zeros((2, 3), np.float32), "b": np.zeros((4, 5), np.float32)})
    # the session stays usable
    (y,) = sess.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((3, 1), np.float32)})
    np.testing.assert_array_equal(y, np.full((2, 1), 3.0, np.float32))


def test_outputs_do_not_alias_feeds():
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    sess = anychip.load(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), devices=["cpu"]
    )
    x = np.zeros(2, np.float32)
    (y,) = sess.run(None, {"x": x})
    y[0] = 5
    assert x[0] == 0
