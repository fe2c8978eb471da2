"""The CPU's pattern passes: Conv -> FusedConv, layer norm, Transpose/Reshape elimination, Pad
folded into Conv; each matched (equal to unfused and onnxruntime) and not matched."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from anychip.backends.cpu.passes.fuse_conv import fast_fused_conv
from tests.backends.cpu._fusion_models import check, force_fuse_conv, model, ops, rand

N = helper.make_node
XS = [("x", [1, 3, 8, 8])]
Y = [("y", [1, 4, 8, 8])]
W = ("w", rand(11, 4, 3, 3, 3) * 0.3)


def _conv(*after, bias=True, inits=(), outputs=Y, inputs=XS):
    conv = N("Conv", ["x", "w", "cb"] if bias else ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    extra = [W, ("cb", rand(12, 4))] if bias else [W]
    return model([conv, *after], inputs, outputs, extra + list(inits))


@pytest.mark.parametrize(
    "act, attrs",
    [("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("HardSigmoid", {})],
)
def test_conv_bias_activation(act, attrs, monkeypatch):
    force_fuse_conv(monkeypatch)
    m = _conv(
        N("Add", ["c", "b"], ["cb2"]),
        N(act, ["cb2"], ["y"], **attrs),
        bias=False,
        inits=[("b", rand(13, 4, 1, 1))],
    )
    assert ops(m) == ["FusedConv"]
    # the per-channel Add becomes the Conv's bias first (fold_conv_affine)
    assert check(m) == {"fold_conv_affine": 1, "fuse_conv": 1}


def test_conv_residual_and_clip_with_constant_bounds(monkeypatch):
    force_fuse_conv(monkeypatch)
    m = _conv(
        N("Add", ["c", "z"], ["s"]),
        N("Clip", ["s", "lo", "hi"], ["y"]),
        inputs=XS + [("z", [1, 4, 8, 8])],
        inits=[("lo", np.array(0.0, np.float32)), ("hi", np.array(0.5, np.float32))],
    )
    assert ops(m) == ["FusedConv"]
    assert check(m) == {"fuse_conv": 1}


def test_conv_residual_sum_of_two_then_relu(monkeypatch):
    force_fuse_conv(monkeypatch)
    # ResNet-50 v1 writes its residual as Sum(conv, shortcut)
    m = _conv(
        N("Sum", ["c", "z"], ["s"]), N("Relu", ["s"], ["y"]), inputs=XS + [("z", [1, 4, 8, 8])]
    )
    assert ops(m) == ["FusedConv"]
    assert check(m) == {"fuse_conv": 1}
    # three operands are not one residual
    m = _conv(
        N("Sum", ["c", "z", "z"], ["s"]),
        N("Relu", ["s"], ["y"]),
        inputs=XS + [("z", [1, 4, 8, 8])],
    )
    assert "Sum" in ops(m)
    check(m)


def test_conv_not_fused_with_the_numpy_kernel():
    m = _conv(N("Relu", ["c"], ["y"]))
    assert ("FusedConv" in ops(m)) == fast_fused_conv()


def test_conv_not_fused(monkeypatch):
    force_fuse_conv(monkeypatch)
    # the conv output is also a graph output
    m = _conv(N("Relu", ["c"], ["y"]), outputs=Y + [("c", [1, 4, 8, 8])])
    assert "FusedConv" not in ops(m)
    # a bias along the wrong axis, then an activation that is not FusedConv's
    # (the Conv alone becomes a FusedConv without them: FuseConvPass.lone)
    m = _conv(N("Add", ["c", "b"], ["s"]), N("Elu", ["s"], ["y"]), inits=[("b", rand(2, 8))])
    assert ops(m).count("Add") == 1 and "Elu" in ops(m)
    check(m)


def test_lone_conv_read_by_a_conv_becomes_fused_conv(monkeypatch):
    force_fuse_conv(monkeypatch)
    # Conv -> Conv: the first has nothing to fuse but is read by a node, so it becomes a
    # FusedConv (its output may then stay channels-last); the second is the graph output
    w2 = ("w2", rand(13, 4, 4, 1, 1) * 0.3)
    m = _conv(N("Conv", ["c", "w2"], ["y"]), inits=[w2])
    assert ops(m) == ["FusedConv", "Conv"]
    check(m)


def _layer_norm(eps_const=True, axes=(-1,), gamma=True):
    nodes = [
        N("ReduceMean", ["x"], ["mean"], axes=list(axes)),
        N("Sub", ["x", "mean"], ["d"]),
        N("Pow", ["d", "two"], ["sq"]),
        N("ReduceMean", ["sq"], ["var"], axes=list(axes)),
        N("Add", ["var", "eps"], ["ve"]),
        N("Sqrt", ["ve"], ["sd"]),
        N("Div", ["d", "sd"], ["n"] if gamma else ["y"]),
    ]
    inits = [("two", np.array(2.0, np.float32))]
    inputs = [("x", [2, 5, 16])]
    if eps_const:
        inits.append(("eps", np.array(1e-5, np.float32)))
    else:
        inputs.append(("eps", [1]))
    if gamma:
        nodes += [N("Mul", ["n", "g"], ["ng"]), N("Add", ["ng", "beta"], ["y"])]
        inits += [("g", rand(4, 16)), ("beta", rand(5, 16))]
    return model(nodes, inputs, [("y", [2, 5, 16])], inits)


def test_layer_norm_fused():
    assert ops(_layer_norm()) == ["LayerNormalization"]
    assert check(_layer_norm()) == {"fuse_layer_norm": 1}
    assert check(_layer_norm(gamma=False)) == {"fuse_layer_norm": 1}


def test_layer_norm_not_fused():
    assert "LayerNormalization" not in ops(_layer_norm(eps_const=False))
    assert "LayerNormalization" not in ops(_layer_norm(axes=(1,)))
    check(_layer_norm(axes=(1,)))


def test_transposes_compose_and_cancel():
    t = [N("Transpose", ["x"], ["t"], perm=[0, 2, 1]), N("Transpose", ["t"], ["u"], perm=[0, 2, 1])]
    m = model(t + [N("Relu", ["u"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 4])])
    assert ops(m) == ["Relu"]
    assert check(m) == {"eliminate_transpose_reshape": 1}
    t[1] = N("Transpose", ["t"], ["u"], perm=[1, 0, 2])
    m = model(t + [N("Relu", ["u"], ["y"])], [("x", [2, 3, 4])], [("y", [4, 2, 3])])
    assert ops(m) == ["Transpose", "Relu"]
    check(m)


def test_reshape_of_reshape_and_identity_reshape():
    shapes = [("s1", np.array([6, 4], np.int64)), ("s2", np.array([2, 12], np.int64))]
    nodes = [N("Reshape", ["x", "s1"], ["r1"]), N("Reshape", ["r1", "s2"], ["r2"])]
    m = model(nodes + [N("Relu", ["r2"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 12])], shapes)
    assert ops(m) == ["Reshape", "Relu"]
    check(m)
    # the inner result read twice: kept
    m = model(
        nodes + [N("Relu", ["r2"], ["y"]), N("Relu", ["r1"], ["z"])],
        [("x", [2, 3, 4])],
        [("y", [2, 12]), ("z", [6, 4])],
        shapes,
    )
    assert ops(m).count("Reshape") == 2
    same = [("s", np.array([2, 3, 4], np.int64))]
    m = model(
        [N("Reshape", ["x", "s"], ["r"]), N("Relu", ["r"], ["y"])],
        [("x", [2, 3, 4])],
        [("y", [2, 3, 4])],
        same,
    )
    assert ops(m) == ["Relu"]


def test_identity_and_inference_dropout_are_bypassed():
    """Identity and an inference Dropout go; a Dropout whose mask is read, or in training
    mode (a constant true, or an input), stays; results equal onnxruntime's either way."""
    body = [N("Relu", ["x"], ["a"]), N("Identity", ["a"], ["b"]), N("Dropout", ["b"], ["c"])]
    m = model(body + [N("Neg", ["c"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 4])])
    assert not {"Identity", "Dropout"} & set(ops(m))
    check(m)
    off = [("r", np.array(0.5, np.float32)), ("t", np.array(False))]
    body = [N("Relu", ["x"], ["a"]), N("Dropout", ["a", "r", "t"], ["c"])]
    m = model(body + [N("Neg", ["c"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 4])], off)
    assert not {"Identity", "Dropout"} & set(ops(m))
    check(m)
    masked = [N("Relu", ["x"], ["a"]), N("Dropout", ["a"], ["c", "mask"])]
    m = helper.make_model(
        helper.make_graph(
            masked + [N("Neg", ["c"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", 1, [2, 3, 4])],
            [helper.make_tensor_value_info("y", 1, [2, 3, 4]),
             helper.make_tensor_value_info("mask", 9, [2, 3, 4])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )  # fmt: skip
    assert "Dropout" in ops(m)
    on = [("r", np.array(0.5, np.float32)), ("t", np.array(True))]
    body = [N("Relu", ["x"], ["a"]), N("Dropout", ["a", "r", "t"], ["c"])]
    m = model(body + [N("Neg", ["c"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 4])], on)
    assert "Dropout" in ops(m)
    for is_test, kept in ((0, True), (1, False)):  # opsets 1-6 train unless is_test is set
        body = [N("Relu", ["x"], ["a"]), N("Dropout", ["a"], ["c"], is_test=is_test)]
        m = model(body + [N("Neg", ["c"], ["y"])], [("x", [2, 3, 4])], [("y", [2, 3, 4])], opset=6)
        assert ("Dropout" in ops(m)) == kept


@pytest.mark.parametrize(
    "pads, mode, fold",
    [
        ([0, 0, 1, 2, 0, 0, 1, 0], "constant", True),
        ([0, 0, 1, 1, 0, 0, 1, 1], "reflect", False),
        ([0, 1, 0, 0, 0, 0, 0, 0], "constant", False),
    ],
)
def test_pad_folded_into_conv(pads, mode, fold):
    conv = N("Conv", ["p", "w"], ["y"], pads=[1, 0, 0, 1])
    pad = N("Pad", ["x", "pads"], ["p"], mode=mode)
    out = [8 + 1 + pads[2] + pads[6] - 2, 8 + 1 + pads[3] + pads[7] - 2]
    w = ("w", rand(11, 4, 3 + pads[1], 3, 3) * 0.3)
    m = model([pad, conv], XS, [("y", [1, 4, *out])], [w, ("pads", np.array(pads, np.int64))])
    assert ("Pad" not in ops(m)) == fold
    assert check(m).get("fold_pad_into_conv", 0) == int(fold)


def test_a_kernel_that_says_it_is_fast_turns_the_conv_fusion_on(monkeypatch):
    from anychip.core.plugin.host import get_registry
    from anychip.ir.dtypes import DType

    table = get_registry().kernel_table("cpu")
    fn = table.lookup("com.microsoft", "FusedConv", 1, DType.FLOAT).kernel.fn
    m = _conv(N("Relu", ["c"], ["y"]))
    monkeypatch.setattr(fn, "fast", lambda: True, raising=False)
    assert ops(m) == ["FusedConv"]
    monkeypatch.setattr(fn, "fast", False, raising=False)
    assert "FusedConv" not in ops(m)


def test_the_conv_fusion_is_off_while_onednn_is_hidden(monkeypatch):
    """The CPU's FusedConv is fast only through oneDNN: hidden, Conv+Relu stay two nodes."""
    from anychip.backends.cpu.onednn import _lib

    m = _conv(N("Relu", ["c"], ["y"]))
    assert ops(m) == ["FusedConv"]
    monkeypatch.setenv("ANYCHIP_ONEDNN", "0")
    _lib.reset()
    try:
        assert "FusedConv" not in ops(m)
    finally:
        monkeypatch.delenv("ANYCHIP_ONEDNN")
        _lib.reset()


@pytest.mark.parametrize(
    "op, attrs, fold",
    [
        ("AveragePool", {}, True),
        ("AveragePool", {"pads": [1, 1, 1, 1]}, False),  # its own padding not counted
        ("AveragePool", {"pads": [1, 1, 1, 1], "count_include_pad": 1}, True),
        ("MaxPool", {}, False),
    ],
)
def test_pad_folded_into_average_pool(op, attrs, fold):
    pad = N("Pad", ["x", "pads"], ["p"])
    pool = N(op, ["p"], ["y"], kernel_shape=[3, 3], **attrs)
    extra = 2 if "pads" in attrs else 0
    out = [1, 3, 8 + 2 - 2 + extra, 8 + 2 - 2 + extra]
    pads = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
    m = model([pad, pool], XS, [("y", out)], [("pads", pads)])
    assert ("Pad" not in ops(m)) == fold
    assert check(m).get("fold_pad_into_conv", 0) == int(fold)


def _gemm(*after, bias_shape=(6,), a_shape=(5, 4), out_shape=(5, 6)):
    mm = N("MatMul", ["a", "w"], ["m"])
    add = N("Add", ["m", "bias"], ["y" if not after else "s"])
    inits = [("w", rand(20, 4, 6)), ("bias", rand(21, *bias_shape))]
    return model([mm, add, *after], [("a", list(a_shape))], [("y", list(out_shape))], inits)


@pytest.mark.parametrize("after", [[], [N("Relu", ["s"], ["y"])], [N("LeakyRelu", ["s"], ["y"])]])
def test_matmul_bias_activation_becomes_fused_gemm(after, monkeypatch):
    from tests.backends.cpu._fusion_models import force_fuse_gemm

    force_fuse_gemm(monkeypatch)
    m = _gemm(*after)
    assert ops(m) == ["FusedGemm"]
    assert check(m) == {"fuse_gemm": 1}


def test_matmul_not_fused_gemm(monkeypatch):
    from anychip.backends.cpu.passes.fuse_gemm import fast_fused_gemm
    from tests.backends.cpu._fusion_models import force_fuse_gemm

    assert ("FusedGemm" in ops(_gemm())) == fast_fused_gemm()  # numpy kernel: left alone
    force_fuse_gemm(monkeypatch)
    m = _gemm(bias_shape=(5, 1))  # a bias along the rows
    assert "FusedGemm" not in ops(m)
    m = _gemm(a_shape=(2, 5, 4), out_shape=(2, 5, 6))  # not 2-D: not a Gemm
    assert "FusedGemm" not in ops(m)
    check(m)
