"""``LowerBatchNormPass``: an inference BatchNormalization no conv absorbed becomes Mul/Add and
fuses with its element-wise neighbours; bit-identical to the BatchNormalization kernel, equal
to onnxruntime; left alone in training form or with statistics that are inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import anychip
from tests.backends.cpu._fusion_models import check, model, ops, rand

N = helper.make_node
XS = [("x", [2, 6, 5, 7])]
Y = [("y", [2, 6, 5, 7])]


def _stats(seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [
        ("s", rng.uniform(0.5, 1.5, 6).astype(np.float32)),
        ("b", rng.standard_normal(6).astype(np.float32)),
        ("mu", rng.standard_normal(6).astype(np.float32)),
        ("var", rng.uniform(0.2, 2.0, 6).astype(np.float32)),
    ]


def _bn_relu(opset: int, **attrs) -> object:
    nodes = [
        N("Concat", ["x", "x"], ["cat"], axis=0),  # a non-conv producer, as DenseNet's Concat
        N("BatchNormalization", ["cat", "s", "b", "mu", "var"], ["n"], **attrs),
        N("Relu", ["n"], ["y"]),
    ]
    return model(nodes, XS, [("y", [4, 6, 5, 7])], _stats(opset), opset=opset)


@pytest.mark.parametrize("opset", [9, 15])
def test_batch_norm_and_relu_one_pass_bit_identical(opset):
    m = _bn_relu(opset, epsilon=1e-3)
    assert ops(m) == ["Concat", "FusedElementwise"]
    assert check(m) == {"lower_batch_norm": 1, "fuse_elementwise": 1}
    data = m.SerializeToString()
    x = rand(3, 2, 6, 5, 7)
    flat = x.reshape(-1)
    flat[::17] = np.resize(np.array([np.nan, np.inf, -np.inf, -0.0], np.float32), flat[::17].size)
    got = anychip.load(data, "cpu").run(None, {"x": x})[0]
    kept = anychip.load(
        data, "cpu", device_options={"cpu": {"disabled_passes": ["lower_batch_norm"]}}
    ).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, kept)  # NaN where NaN, bit for bit elsewhere


def test_training_form_left_alone():
    nodes = [
        N("BatchNormalization", ["x", "s", "b", "mu", "var"], ["y", "rm", "rv"], training_mode=1)
    ]
    m = model(nodes, XS, Y + [("rm", [6]), ("rv", [6])], _stats(1), opset=15)
    assert "BatchNormalization" in ops(m)


def test_statistics_from_inputs_left_alone():
    nodes = [N("BatchNormalization", ["x", "s", "b", "mu", "var"], ["y"])]
    inputs = XS + [("s", [6]), ("b", [6]), ("mu", [6]), ("var", [6])]
    m = model(nodes, inputs, Y, opset=15)
    assert "BatchNormalization" in ops(m)
