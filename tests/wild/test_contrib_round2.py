"""Issue 46's contrib-op causes, each on a model made here and compared with onnxruntime:
onnxruntime's normalization ops in the default domain, float16 sums kept in float32, and the
generation-loop ops refused at load with a message naming them."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper as h
from onnx import numpy_helper as nh

import anychip
from tests.wild._compare import anychip_run, assert_same, ort_run

_MS = "com.microsoft"


def _model(
    nodes: list[onnx.NodeProto],
    feeds: dict[str, np.ndarray],
    consts: dict[str, np.ndarray],
    outputs: list[str],
    opset: int = 17,
) -> onnx.ModelProto:
    g = h.make_graph(
        nodes,
        "g",
        [
            h.make_tensor_value_info(k, nh.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [h.make_empty_tensor_value_info(o) for o in outputs],
        [nh.from_array(v, k) for k, v in consts.items()],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset), h.make_opsetid(_MS, 1)])
    m.ir_version = 8
    return m


def _same(model: onnx.ModelProto, feeds: dict[str, Any], atol: float, rtol: float = 0.0) -> list:
    want = ort_run(model, feeds)
    got, warned = anychip_run(model, feeds)
    assert_same(got, want, rtol=rtol, atol=atol)
    return warned


@pytest.mark.parametrize("opset", [13, 17, 20])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_simplified_layer_norm_in_the_default_domain(opset, dtype) -> None:
    """onnxruntime registers SimplifiedLayerNormalization in the ai.onnx domain (no ONNX op
    of that name): the load reads it as the contrib op and says so."""
    rng = np.random.default_rng(46)
    x = (rng.standard_normal((2, 5, 32)) * 2 + 1).astype(dtype)
    g = rng.standard_normal(32).astype(dtype)
    node = h.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], epsilon=1e-5)
    warned = _same(_model([node], {"x": x}, {"g": g}, ["y"], opset), {"x": x}, atol=2e-3)
    assert any("SimplifiedLayerNormalization" in w for w in warned), warned


@pytest.mark.parametrize("offset", [0.0, 30.0])
def test_embed_layer_norm_float16_sums_in_float32(offset) -> None:
    """float16 tables are added in float32 before the normalization, as onnxruntime does:
    summed in float16, rows near ``offset`` lost up to 0.13 against it."""
    rng = np.random.default_rng(7)
    hid = 768
    ids = rng.integers(0, 50, (2, 8)).astype(np.int32)
    consts = {
        "we": (rng.standard_normal((50, hid)) + offset).astype(np.float16),
        "pe": rng.standard_normal((8, hid)).astype(np.float16),
        "g": rng.standard_normal(hid).astype(np.float16),
        "b": rng.standard_normal(hid).astype(np.float16),
    }
    node = h.make_node(
        "EmbedLayerNormalization",
        ["ids", "", "we", "pe", "", "g", "b"],
        ["y", "mask_index"],
        domain=_MS,
        epsilon=1e-5,
    )
    # float16's step at |y| < 8 is at most 2**-8: one step for the sums' order
    _same(_model([node], {"ids": ids}, consts, ["y", "mask_index"]), {"ids": ids}, atol=4e-3)


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_skip_layer_norm_float16_statistics_in_float32(op) -> None:
    rng = np.random.default_rng(8)
    hid = 768
    x = (rng.standard_normal((2, 8, hid)) * 3 + 30).astype(np.float16)
    s = rng.standard_normal((2, 8, hid)).astype(np.float16)
    g, b, bias = (rng.standard_normal(hid).astype(np.float16) for _ in range(3))
    if op == "SkipLayerNormalization":
        ins, consts = ["x", "s", "g", "b", "bias"], {"g": g, "b": b, "bias": bias}
    else:
        ins, consts = ["x", "s", "g", "bias"], {"g": g, "bias": bias}
    outs = ["y", "mean", "inv", "sum"]
    node = h.make_node(op, ins, outs, domain=_MS, epsilon=1e-5)
    feeds = {"x": x, "s": s}
    _same(_model([node], feeds, consts, outs), feeds, atol=4e-3, rtol=1e-5)


@pytest.mark.parametrize(
    "op",
    ["WhisperBeamSearch", "DecoderMaskedMultiHeadAttention"],
)
def test_generation_ops_refused_naming_the_op(op) -> None:
    x = np.zeros((1, 4), np.int32)
    node = h.make_node(op, ["x"], ["y"], domain=_MS)
    model = _model([node], {"x": x}, {}, ["y"])
    with pytest.raises(anychip.UnsupportedOpError) as err:
        anychip.load(model, devices=["cpu"])
    msg = str(err.value)
    assert f"com.microsoft.{op} is not supported" in msg
    assert "use onnxruntime for generation loops" in msg


def test_unknown_contrib_op_says_anychip_has_no_kernel() -> None:
    x = np.zeros((1, 4), np.float32)
    model = _model([h.make_node("NoSuchFusion", ["x"], ["y"], domain=_MS)], {"x": x}, {}, ["y"])
    with pytest.raises(anychip.UnsupportedOpError) as err:
        anychip.load(model, devices=["cpu"])
    msg = str(err.value)
    assert "anychip has no kernel for com.microsoft.NoSuchFusion" in msg
    assert "not registered" not in msg


def test_multi_head_attention_cache_indirection_without_a_cache_is_not_read() -> None:
    """With no shared past (decision 048) the indirection is not read, as in onnxruntime."""
    rng = np.random.default_rng(9)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    ci = np.zeros((2, 1, 4), np.int32)
    node = h.make_node(
        "MultiHeadAttention",
        ["q", "q", "q", "", "", "", "", "", "", "ci"],
        ["y"],
        domain=_MS,
        num_heads=2,
    )
    feeds = {"q": q, "ci": ci}
    _same(_model([node], feeds, {}, ["y"]), feeds, atol=1e-5, rtol=1e-4)


def test_layer_norm_stash_outputs_at_opset_13() -> None:
    """LayerNormalization before opset 17 with its Mean and InvStdDev outputs used."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 4, 16)).astype(np.float32)
    consts = {"g": rng.standard_normal(16).astype(np.float32)}
    consts["b"] = rng.standard_normal(16).astype(np.float32)
    outs = ["y", "mean", "inv"]
    node = h.make_node("LayerNormalization", ["x", "g", "b"], outs, epsilon=1e-5, axis=-1)
    _same(_model([node], {"x": x}, consts, outs, opset=13), {"x": x}, atol=1e-5, rtol=1e-5)
