"""Fused element-wise chains on OpenCL: the CPU's fusion pass on an OpenCL partition, the
chain as one launch of the code generator's OpenCL C, against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip

pytestmark = pytest.mark.usefixtures("cl_device")


def _chain(bshape: tuple[int, ...], dtype: int = TensorProto.FLOAT) -> bytes:
    """x*sigmoid(x) + b, then erf-GELU, Tanh and a Max with a third input: one group."""
    np_dt = np.float32 if dtype == TensorProto.FLOAT else np.float64
    rng = np.random.default_rng(3)
    b = numpy_helper.from_array(rng.standard_normal(bshape).astype(np_dt), "b")
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["xs"]),
        helper.make_node("Add", ["xs", "b"], ["h"]),
        helper.make_node("Gelu", ["h"], ["g"]),
        helper.make_node("Tanh", ["g"], ["t"]),
        helper.make_node("Max", ["t", "z"], ["y"]),
    ]
    shape = [2, 8, 5, 6]
    g = helper.make_graph(
        nodes,
        "chain",
        [
            helper.make_tensor_value_info("x", dtype, shape),
            helper.make_tensor_value_info("z", dtype, [6]),
        ],
        [helper.make_tensor_value_info("y", dtype, shape)],
        [b],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    return m.SerializeToString()


@pytest.mark.parametrize(
    "bshape",
    [(2, 8, 5, 6), (8, 1, 1), (1,), (2, 1, 5, 1)],  # full, per-channel, scalar, none fits
)
def test_a_chain_is_one_fused_launch_on_opencl(bshape):
    model = _chain(bshape)
    rng = np.random.default_rng(0)
    feeds = {
        "x": (rng.standard_normal((2, 8, 5, 6)) * 3).astype(np.float32),
        "z": rng.standard_normal(6).astype(np.float32),
    }
    feeds["x"][0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    (ref,) = ort.InferenceSession(model).run(None, feeds)
    sess = anychip.load(model, devices=["opencl"], strict=True)
    (got,) = sess.run(None, feeds)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6)
    (part,) = sess.compiled.partitions
    assert part.device == "opencl" and part.info["fusions"] == {"fuse_elementwise": 1}
    assert [n.op_type for n in part.graph.nodes] == ["FusedElementwise"]


def test_fusion_off_gives_the_same_result_with_one_launch_per_op():
    model = _chain((8, 1, 1))
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.standard_normal((2, 8, 5, 6)).astype(np.float32),
        "z": rng.standard_normal(6).astype(np.float32),
    }
    fused = anychip.load(model, devices=["opencl"], strict=True)
    plain = anychip.load(model, devices=["opencl"], strict=True, optimize=False)
    assert len(plain.compiled.partitions[0].graph.nodes) == 6
    np.testing.assert_allclose(
        fused.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=2e-6, atol=2e-6
    )


def test_a_select_from_a_comparison_builds_on_opencl():
    """LeakyRelu lowers to select(x >= 0, ...): OpenCL C takes no float condition in ?:."""
    g = helper.make_graph(
        [
            helper.make_node("LeakyRelu", ["x"], ["l"], alpha=0.1),
            helper.make_node("Mul", ["l", "x"], ["y"]),
        ],
        "leaky",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = np.random.default_rng(2).standard_normal((3, 7)).astype(np.float32)
    (ref,) = ort.InferenceSession(model).run(None, {"x": x})
    sess = anychip.load(model, devices=["opencl"], strict=True)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-6, atol=1e-7)
    assert [n.op_type for n in sess.compiled.partitions[0].graph.nodes] == ["FusedElementwise"]
