"""Each ``com.microsoft`` op anychip implements, against onnxruntime's own kernel, on seeded
random inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper as h
from onnx import numpy_helper as nh

from tests.wild._compare import anychip_run, assert_same, ort_run

_MS = "com.microsoft"


def _model(
    op: str,
    feeds: dict[str, np.ndarray],
    consts: dict[str, np.ndarray],
    inputs: list[str],
    n_out: int = 1,
    **attrs: Any,
) -> onnx.ModelProto:
    outs = [f"y{i}" for i in range(n_out)]
    node = h.make_node(op, inputs, outs, domain=_MS, **attrs)
    g = h.make_graph(
        [node],
        "g",
        [
            h.make_tensor_value_info(k, nh.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [onnx.helper.make_empty_tensor_value_info(o) for o in outs],
        [nh.from_array(v, k) for k, v in consts.items()],
    )
    opsets = [h.make_opsetid("", 17), h.make_opsetid(_MS, 1)]
    return h.make_model(g, opset_imports=opsets)


def _check(op, feeds, consts, inputs, n_out=1, atol=1e-5, **attrs) -> None:
    model = _model(op, feeds, consts, inputs, n_out, **attrs)
    want = ort_run(model, feeds)
    got, _ = anychip_run(model, feeds)
    assert_same(got, want, rtol=1e-4, atol=atol)


def _f(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_gelu_family() -> None:
    rng = np.random.default_rng(0)
    x, b = _f(rng, 2, 5, 8), _f(rng, 8)
    _check("Gelu", {"x": x}, {}, ["x"])
    _check("FastGelu", {"x": x}, {"b": b}, ["x", "b"], atol=1e-4)
    _check("FastGelu", {"x": x}, {}, ["x"], atol=1e-4)
    _check("BiasGelu", {"x": x}, {"b": b}, ["x", "b"])
    _check("QuickGelu", {"x": x}, {}, ["x"], alpha=1.5)


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"transA": 1},
        {"transB": 1, "alpha": 0.5},
        {"transBatchA": 1},
        {"transBatchB": 1, "transB": 1},
    ],
)
def test_fused_matmul(attrs) -> None:
    rng = np.random.default_rng(1)
    a = _f(rng, 3, 4, 5) if not attrs.get("transA") else _f(rng, 3, 5, 4)
    if attrs.get("transBatchA"):
        a = _f(rng, 4, 3, 5)
    b = _f(rng, 3, 6, 5) if attrs.get("transB") else _f(rng, 3, 5, 6)
    if attrs.get("transBatchB"):
        b = _f(rng, 6, 3, 5)
    _check("FusedMatMul", {"a": a, "b": b}, {}, ["a", "b"], **attrs)


@pytest.mark.parametrize(
    "act, extra",
    [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2}), ("Sigmoid", {}), ("Tanh", {})],
)
def test_fused_gemm(act, extra) -> None:
    rng = np.random.default_rng(2)
    a, b, c = _f(rng, 4, 6), _f(rng, 5, 6), _f(rng, 5)
    _check(
        "FusedGemm",
        {"a": a},
        {"b": b, "c": c},
        ["a", "b", "c"],
        transB=1,
        alpha=0.7,
        beta=0.3,
        activation=act,
        **extra,
    )


def test_skip_layer_normalization() -> None:
    rng = np.random.default_rng(3)
    x, s = _f(rng, 2, 4, 16), _f(rng, 2, 4, 16)
    consts = {"g": _f(rng, 16), "be": _f(rng, 16), "bi": _f(rng, 16)}
    _check(
        "SkipLayerNormalization",
        {"x": x, "s": s},
        consts,
        ["x", "s", "g", "be", "bi"],
        n_out=4,
        epsilon=1e-5,
        atol=1e-4,
    )
    _check(
        "SkipSimplifiedLayerNormalization",
        {"x": x, "s": s},
        {"g": consts["g"]},
        ["x", "s", "g"],
        n_out=1,
        epsilon=1e-5,
        atol=1e-4,
    )


def test_embed_layer_normalization() -> None:
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 30, (2, 7)).astype(np.int32)
    seg = rng.integers(0, 2, (2, 7)).astype(np.int32)
    mask = (rng.random((2, 7)) > 0.3).astype(np.int32)
    consts = {
        "we": _f(rng, 30, 16),
        "pe": _f(rng, 10, 16),
        "se": _f(rng, 2, 16),
        "g": _f(rng, 16),
        "b": _f(rng, 16),
    }
    _check(
        "EmbedLayerNormalization",
        {"ids": ids, "seg": seg, "mask": mask},
        consts,
        ["ids", "seg", "we", "pe", "se", "g", "b", "mask"],
        n_out=2,
        atol=1e-4,
    )


@pytest.mark.parametrize("mask_kind", ["none", "raw", "lengths", "causal", "past"])
def test_attention(mask_kind) -> None:
    rng = np.random.default_rng(5)
    b, s, d, heads = 2, 6, 16, 4
    feeds: dict[str, np.ndarray] = {"x": _f(rng, b, s, d)}
    consts = {"w": _f(rng, d, 3 * d) * 0.3, "bias": _f(rng, 3 * d) * 0.1}
    inputs, attrs, n_out = ["x", "w", "bias"], {"num_heads": heads}, 1
    if mask_kind == "raw":
        feeds["m"] = np.concatenate([np.ones((b, 4)), rng.integers(0, 2, (b, 2))], 1).astype(
            np.int32
        )
        inputs.append("m")
    elif mask_kind == "lengths":
        feeds["m"] = np.array([6, 3], np.int32)
        inputs.append("m")
    elif mask_kind == "causal":
        attrs["unidirectional"] = 1
    elif mask_kind == "past":
        feeds["past"] = _f(rng, 2, b, heads, 3, d // heads)
        inputs += ["", "past"]
        attrs["unidirectional"] = 1
        n_out = 2
    _check("Attention", feeds, consts, inputs, n_out=n_out, atol=1e-4, **attrs)


@pytest.mark.parametrize("kind", ["separate", "bias_mask", "past"])
def test_multi_head_attention(kind) -> None:
    rng = np.random.default_rng(6)
    b, s, l, d, heads = 2, 5, 7, 16, 2
    feeds = {"q": _f(rng, b, s, d), "k": _f(rng, b, l, d), "v": _f(rng, b, l, d)}
    inputs, n_out = ["q", "k", "v"], 1
    if kind == "bias_mask":
        feeds["bias"] = _f(rng, 3 * d)
        feeds["mask"] = np.concatenate([np.ones((b, 5)), np.zeros((b, 2))], 1).astype(np.int32)
        inputs += ["bias", "mask"]
    elif kind == "past":
        feeds["pk"], feeds["pv"] = _f(rng, b, heads, 3, d // heads), _f(rng, b, heads, 3, 8)
        inputs += ["", "", "", "pk", "pv"]
        n_out = 3
    _check("MultiHeadAttention", feeds, {}, inputs, n_out=n_out, atol=1e-4, num_heads=heads)


def _qparams(rng, dtype):
    lo = np.iinfo(dtype).min
    return np.float32(rng.uniform(0.01, 0.1)), np.array(lo + rng.integers(100, 150), dtype)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_binary_and_unary(dtype) -> None:
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max + 1, (3, 8), dtype=dtype)
    bb = rng.integers(info.min, info.max + 1, (8,), dtype=dtype)
    (sa, za), (sb, zb), (sc, zc) = (_qparams(rng, dtype) for _ in range(3))
    consts = {"sa": sa, "za": za, "b": bb, "sb": sb, "zb": zb, "sc": sc, "zc": zc}
    for op in ("QLinearAdd", "QLinearMul"):
        _check(op, {"a": a}, consts, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], atol=1)
    unary = {"sa": sa, "za": za, "sc": np.float32(1 / 256), "zc": np.array(info.min, dtype)}
    _check("QLinearSigmoid", {"a": a}, unary, ["a", "sa", "za", "sc", "zc"], atol=1)
    _check("QLinearLeakyRelu", {"a": a}, consts, ["a", "sa", "za", "sc", "zc"], alpha=0.1, atol=1)
    for opset, axis in ((13, -1), (12, 1)):
        _check("QLinearSoftmax", {"a": a}, unary, ["a", "sa", "za", "sc", "zc"], atol=1,
               opset=opset, axis=axis)  # fmt: skip
    pool = rng.integers(info.min, info.max + 1, (1, 3, 6, 6), dtype=dtype)
    _check("QLinearGlobalAveragePool", {"a": pool}, consts, ["a", "sa", "za", "sc", "zc"], atol=1)
    _check(
        "QLinearAveragePool",
        {"a": pool},
        consts,
        ["a", "sa", "za", "sc", "zc"],
        atol=1,
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
    )
    _check(
        "QLinearConcat",
        {"a": a},
        consts,
        ["sc", "zc", "a", "sa", "za", "a", "sb", "zb"],
        axis=1,
        atol=1,
    )


def test_qgemm_per_channel() -> None:
    rng = np.random.default_rng(8)
    a = rng.integers(0, 256, (4, 6), dtype=np.uint8)
    b = rng.integers(-127, 128, (5, 6), dtype=np.int8)
    consts = {
        "sa": np.float32(0.02),
        "za": np.array(128, np.uint8),
        "b": b,
        "sb": rng.uniform(0.01, 0.05, 5).astype(np.float32),
        "zb": np.zeros(5, np.int8),
        "c": rng.integers(-500, 500, 5).astype(np.int32),
        "sy": np.float32(0.05),
        "zy": np.array(120, np.uint8),
    }
    _check("QGemm", {"a": a}, consts, ["a", "sa", "za", "b", "sb", "zb", "c"], transB=1, atol=1e-3)
    _check(
        "QGemm",
        {"a": a},
        consts,
        ["a", "sa", "za", "b", "sb", "zb", "c", "sy", "zy"],
        transB=1,
        atol=1,
    )


@pytest.mark.parametrize("dtype", [np.uint16, np.int16, np.int8])
def test_quantize_dequantize_linear_16_bit(dtype) -> None:
    rng = np.random.default_rng(9)
    x = _f(rng, 3, 4) * 10
    consts = {
        "s": rng.uniform(0.01, 0.1, 4).astype(np.float32),
        "z": rng.integers(0, 100, 4).astype(dtype),
    }
    _check("QuantizeLinear", {"x": x}, consts, ["x", "s", "z"], axis=1, atol=0)
    q = rng.integers(0, 100, (3, 4)).astype(dtype)
    _check("DequantizeLinear", {"q": q}, consts, ["q", "s", "z"], axis=1)


@pytest.mark.parametrize("with_past", [False, True])
def test_qattention(with_past) -> None:
    # The "quantized attention with a past state" differed by up to 15%.
    rng = np.random.default_rng(10)
    b, s, d, heads = 2, 4, 16, 4
    feeds = {"x": rng.integers(0, 256, (b, s, d), dtype=np.uint8)}
    consts = {
        "w": rng.integers(-127, 128, (d, 3 * d), dtype=np.int8),
        "bias": _f(rng, 3 * d) * 0.1,
        "sx": np.float32(0.02),
        "sw": np.float32(0.01),
        "zx": np.array(128, np.uint8),
        "zw": np.array(0, np.int8),
    }
    inputs, n_out = ["x", "w", "bias", "sx", "sw", "", "zx", "zw"], 1
    if with_past:
        feeds["past"] = _f(rng, 2, b, heads, 3, d // heads)
        inputs.append("past")
        n_out = 2
    _check(
        "QAttention",
        feeds,
        consts,
        inputs,
        n_out=n_out,
        atol=1e-4,
        num_heads=heads,
        unidirectional=int(with_past),
    )


def test_bert_fused_by_onnxruntimes_optimizer() -> None:
    from bench._wild_cases import _fused_bert
    from bench._wild_models import bert_feeds

    model = _fused_bert(True)
    ops = {n.op_type for n in model.graph.node if n.domain == _MS}
    assert ops == {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "FastGelu"}
    feeds = bert_feeds()
    got, _ = anychip_run(model, feeds)
    assert_same(got, ort_run(model, feeds), rtol=1e-4, atol=1e-4)
