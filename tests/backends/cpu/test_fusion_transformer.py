"""Attention, Softmax and GELU recognizers: matched and not matched, equal to the unfused
graph and onnxruntime; a BERT-like and a causal layer (tests/models.py) fused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

from tests.backends.cpu._fusion_models import check, model, ops, rand
from tests.models import transformer_layer

N = helper.make_node


def _attention(scale_op="Div", mask=True, softmax_axis=-1, extra_reader=False):
    nodes = [
        N("MatMul", ["q", "kt"], ["s"]),
        N(scale_op, ["s", "c"], ["ss"]),
    ]
    scores = "ss"
    if mask:
        nodes.append(N("Add", ["ss", "mask"], ["sm"]))
        scores = "sm"
    nodes += [N("Softmax", [scores], ["p"], axis=softmax_axis), N("MatMul", ["p", "v"], ["y"])]
    outputs = [("y", [2, 3, 5, 8])]
    if extra_reader:
        outputs.append(("p", [2, 3, 5, 7]))
    inits = [("c", np.array(math.sqrt(8), np.float32)), ("mask", rand(9, 5, 7))]
    inputs = [("q", [2, 3, 5, 8]), ("kt", [2, 3, 8, 7]), ("v", [2, 3, 7, 8])]
    return model(nodes, inputs, outputs, inits)


@pytest.mark.parametrize("scale_op, mask", [("Div", True), ("Mul", False)])
def test_attention_fused(scale_op, mask):
    m = _attention(scale_op, mask)
    assert ops(m) == ["FusedAttention"]
    assert check(m) == {"fuse_attention": 1}


def test_attention_not_fused():
    assert "FusedAttention" not in ops(_attention(softmax_axis=2))
    m = _attention(extra_reader=True)
    assert "FusedAttention" not in ops(m)
    check(m)


def _softmax(stable=True, axes=(1,), sum_axes=None):
    nodes = []
    src = "x"
    if stable:
        nodes += [N("ReduceMax", ["x"], ["m"], axes=list(axes)), N("Sub", ["x", "m"], ["d"])]
        src = "d"
    sum_axes = np.array(sum_axes or axes, np.int64)
    nodes += [
        N("Exp", [src], ["e"]),
        N("ReduceSum", ["e", "ax"], ["s"]),
        N("Div", ["e", "s"], ["y"]),
    ]
    return model(nodes, [("x", [3, 6, 4])], [("y", [3, 6, 4])], [("ax", sum_axes)])


def test_stable_softmax_becomes_softmax():
    assert ops(_softmax()) == ["Softmax"]
    assert check(_softmax()) == {"fuse_softmax": 1}


def test_softmax_not_fused():
    assert "Softmax" not in ops(_softmax(stable=False))  # overflows where Softmax does not
    assert "Softmax" not in ops(_softmax(sum_axes=(2,)))
    check(_softmax(sum_axes=(2,)))


def _gelu(divide=True, half_first=False, c=None):
    c = c if c is not None else (math.sqrt(2) if divide else 1 / math.sqrt(2))
    nodes = [N("Div" if divide else "Mul", ["x", "c"], ["xs"]), N("Erf", ["xs"], ["e"])]
    nodes.append(N("Add", ["e", "one"], ["a"]))
    if half_first:
        nodes += [N("Mul", ["x", "half"], ["h"]), N("Mul", ["h", "a"], ["y"])]
    else:
        nodes += [N("Mul", ["x", "a"], ["xa"]), N("Mul", ["xa", "half"], ["y"])]
    inits = [(k, np.array(v, np.float32)) for k, v in (("c", c), ("one", 1.0), ("half", 0.5))]
    return model(nodes, [("x", [4, 16])], [("y", [4, 16])], inits)


@pytest.mark.parametrize("divide, half_first", [(True, False), (False, True)])
def test_gelu_erf_form(divide, half_first):
    m = _gelu(divide, half_first)
    assert ops(m, disabled_passes=["fuse_elementwise"]) == ["Gelu"]
    assert check(m) == {"fuse_gelu": 1, "fuse_elementwise": 1}  # then one generated kernel


def test_gelu_with_another_constant_is_not_gelu():
    m = _gelu(c=1.5)
    assert "Gelu" not in ops(m, disabled_passes=["fuse_elementwise"])
    assert check(m) == {"fuse_elementwise": 1}  # still one generated kernel


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_layer_fused(causal):
    counts = check(transformer_layer(seq=16, hidden=64, heads=2, ffn=128, causal=causal))
    assert counts["fuse_attention"] == 1 and counts["fuse_gelu"] == 1
