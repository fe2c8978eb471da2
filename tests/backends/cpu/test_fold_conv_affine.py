"""``FoldConvAffinePass``: Conv then Mul/Add by per-output-channel constants folded into the
Conv's weights and bias; equal to the unfolded graph and onnxruntime, and left alone where
the constant is not one value per output channel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.backends.cpu._fusion_models import check, model, ops, rand

N = helper.make_node
XS = [("x", [2, 6, 9, 9])]
Y = [("y", [2, 8, 9, 9])]


def _conv_then(after, consts, bias=True, group=1):
    w = ("w", rand(1, 8, 6 // group, 3, 3) * 0.05)  # outputs near 1: check's atol is 1e-6
    ins = ["x", "w", "cb"] if bias else ["x", "w"]
    conv = N("Conv", ins, ["c"], pads=[1, 1, 1, 1], group=group)
    inits = [w, ("cb", rand(2, 8))] if bias else [w]
    return model([conv, *after], XS, Y, inits + list(consts))


@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1, 1), (), (1,)])
@pytest.mark.parametrize("bias", [True, False])
def test_scale_then_shift_folded(shape, bias):
    m = _conv_then(
        [N("Mul", ["c", "k"], ["m"]), N("Add", ["b", "m"], ["y"])],  # the constant on either side
        [("k", rand(3, *shape) * 0.3 + 1.0), ("b", rand(4, *shape) * 0.1)],
        bias=bias,
    )
    assert ops(m) == ["Conv"]
    assert check(m) == {"fold_conv_affine": 2}


def test_grouped_conv_scale_then_relu_becomes_one_kernel():
    m = _conv_then(
        [N("Mul", ["c", "k"], ["m"]), N("Add", ["m", "b"], ["a"]), N("Relu", ["a"], ["y"])],
        [("k", rand(5, 8, 1, 1)), ("b", rand(6, 8, 1, 1))],
        group=2,
    )
    counts = check(m)
    assert counts["fold_conv_affine"] == 2
    assert len(ops(m)) == 1  # FusedConv with oneDNN, else Conv -> Relu fused element-wise


@pytest.mark.parametrize(
    "after, consts",
    [
        # along the width, not the channels
        ([N("Mul", ["c", "k"], ["y"])], [("k", rand(7, 9))]),
        # a full-shape operand
        ([N("Add", ["c", "k"], ["y"])], [("k", rand(8, 2, 8, 9, 9))]),
        # not a constant: an input of the graph
        ([N("Mul", ["c", "c"], ["y"])], []),
    ],
)
def test_not_per_channel_left_alone(after, consts):
    m = _conv_then(after, consts)
    assert "fold_conv_affine" not in check(m)
    assert len(ops(m)) == 2  # the Conv and the Mul/Add (fused element-wise or not)


def test_conv_output_read_twice_left_alone():
    m = _conv_then(
        [N("Mul", ["c", "k"], ["m"]), N("Add", ["m", "c"], ["y"])], [("k", rand(9, 8, 1, 1))]
    )
    assert "fold_conv_affine" not in check(m)


def test_scaled_weights_are_new_constants():
    # the original weights stay as they were (another reader, another session)
    m = _conv_then([N("Mul", ["c", "k"], ["y"])], [("k", np.full((8, 1, 1), 3.0, np.float32))])
    before = np.frombuffer(m.graph.initializer[0].raw_data, np.float32).copy()
    check(m)
    assert np.array_equal(np.frombuffer(m.graph.initializer[0].raw_data, np.float32), before)
