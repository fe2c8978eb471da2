"""``FuseSkipLayerNormPass``: a residual Add and a last-axis LayerNormalization become one
``com.microsoft`` SkipLayerNormalization, equal to the unfused nodes and onnxruntime; the sum
stays an output where something else reads it; left alone where the pattern differs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.backends.cpu._fusion_models import check, model, ops, rand

N = helper.make_node
W = 32


def _residual(shape=(2, 16, W), axis=-1, gamma=True, beta=True, sum_read=False,
              sum_out=False, mean_out=False, skip_shape=None, const_skip=False):  # fmt: skip
    ln_in = ["s", "g"] + (["b"] if beta else [])
    ln_out = ["y"] + (["mean"] if mean_out else [])
    nodes = [
        N("Add", ["x", "k"], ["s"]),
        N("LayerNormalization", ln_in, ln_out, axis=axis, epsilon=1e-5),
    ]
    outputs = [("y", list(shape))]
    if sum_read:  # the pre-norm residual stream: the sum read again
        nodes.append(N("Add", ["s", "y"], ["r"]))
        outputs.append(("r", list(shape)))
    if sum_out:
        outputs.append(("s", list(shape)))
    if mean_out:
        outputs.append(("mean", list(shape[:-1]) + [1]))
    norm = shape[axis:]  # the normalized axes' shape
    inits = [("g", rand(3, *norm) if gamma else np.ones(norm, np.float32))]
    inits += [("b", rand(4, *norm))] if beta else []
    kshape = list(skip_shape or shape)
    inputs = [("x", list(shape))]
    if const_skip:
        inits.append(("k", rand(5, *kshape)))
    else:
        inputs.append(("k", kshape))
    return model(nodes, inputs, outputs, inits)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"beta": False},
        {"gamma": False},
        {"shape": (5, W)},
        {"shape": (1, 3, 7, 40)},
        {"axis": 2},
    ],
)
def test_add_then_layer_norm_fused(kw):
    m = _residual(**kw)
    assert ops(m) == ["SkipLayerNormalization"]
    assert check(m, seed=len(kw)) == {"fuse_skip_layer_norm": 1}


@pytest.mark.parametrize("kw", [{"sum_read": True}, {"sum_out": True}])
def test_the_sum_stays_an_output_where_it_is_read(kw):
    m = _residual(**kw)
    assert ops(m)[0] == "SkipLayerNormalization"
    assert check(m, seed=7)["fuse_skip_layer_norm"] == 1


def _fused_and_unfused(m, feeds):
    import anychip

    data = m.SerializeToString()
    fused = anychip.load(data, "cpu").run(None, feeds)
    plain = anychip.load(data, "cpu", device_options={"cpu": {"fusion": False}}).run(None, feeds)
    return fused, plain


@pytest.mark.parametrize(
    "kw",
    [
        {"axis": 1},  # not the last axis alone
        {"mean_out": True},  # the statistics are read
        {"skip_shape": (1, 16, W)},  # a broadcasting Add
        {"const_skip": True},  # a constant addend: a bias, fuse_gemm's
    ],
)
def test_other_patterns_left_alone(kw):
    m = _residual(**kw)
    assert "SkipLayerNormalization" not in ops(m)
    check(m, seed=11)


def test_fused_results_with_nan_and_inf_equal_the_unfused():
    x, k = rand(13, 2, 16, W), rand(14, 2, 16, W)
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    k[1, 2, 5] = np.inf
    (fused,), (want,) = _fused_and_unfused(_residual(), {"x": x, "k": k})
    assert np.isnan(want).any()
    assert np.array_equal(np.isnan(fused), np.isnan(want))
    np.testing.assert_allclose(fused[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-6)
