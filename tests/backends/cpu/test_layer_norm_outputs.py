"""LayerNormalization and SkipLayerNormalization nodes compute the statistics and the sum
only where the node uses them (``KernelContext.outputs_used``): nodes of one output, of some and of
all, against onnxruntime (Y, and the sum) and against the numpy kernel (the statistics), on
seeded random data over runs with new inputs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.backends.cpu.kernels.op_contrib_transformer import skip_layer_normalization
from anychip.backends.cpu.kernels.op_layer_normalization import layer_normalization
from tests.backends.cpu._fusion_models import rand

F = TensorProto.FLOAT
SHAPE = [2, 7, 24]


def _model(node, outputs, opsets):
    graph = helper.make_graph(
        [node],
        "ln",
        [helper.make_tensor_value_info(n, F, SHAPE) for n in ("x", "s")],
        [helper.make_tensor_value_info(n, F, None) for n in outputs if n],
        [
            helper.make_tensor("g", F, [24], rand(1, 24)),
            helper.make_tensor("b", F, [24], rand(2, 24)),
        ],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize(
    "outputs", [["y"], ["y", "", "", "sum"], ["y", "mean", "inv", "sum"], ["y", "mean"]]
)
def test_skip_layer_norm_outputs(outputs):
    node = helper.make_node(
        "SkipLayerNormalization", ["x", "s", "g", "b"], outputs, domain="com.microsoft",
        epsilon=1e-5,
    )  # fmt: skip
    data = _model(node, outputs, [("", 17), ("com.microsoft", 1)])
    sess = anychip.load(data, "cpu")
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [n for n in outputs if n]
    for seed in range(3):
        feeds = {"x": rand(10 + seed, *SHAPE), "s": rand(20 + seed, *SHAPE)}
        got = dict(zip(names, sess.run(None, feeds)))
        want = skip_layer_normalization(feeds["x"], feeds["s"], rand(1, 24), rand(2, 24),
                                        epsilon=1e-5)  # fmt: skip
        theirs = dict(zip(names, ref.run(None, feeds)))
        np.testing.assert_allclose(got["y"], theirs["y"], rtol=1e-5, atol=1e-5)
        for name, index in (("y", 0), ("mean", 1), ("inv", 2), ("sum", 3)):
            if name in got:
                np.testing.assert_array_equal(got[name], want[index].reshape(got[name].shape))


@pytest.mark.parametrize("outputs", [["y"], ["y", "mean", "inv"], ["y", "", "inv"]])
def test_layer_norm_outputs(outputs):
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], outputs, axis=-1, epsilon=1e-5)
    data = _model(node, outputs, [("", 17)])
    sess = anychip.load(data, "cpu")
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [n for n in outputs if n]
    for seed in range(3):
        feeds = {"x": rand(30 + seed, *SHAPE), "s": rand(40 + seed, *SHAPE)}
        got = sess.run(None, feeds)
        want = layer_normalization(feeds["x"], rand(1, 24), rand(2, 24), axis=-1, epsilon=1e-5)
        for name, g, r in zip(names, got, ref.run(None, feeds)):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(g, want[("y", "mean", "inv").index(name)])
