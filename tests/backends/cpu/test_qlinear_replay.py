"""The quantized ops' C calls replayed (``backends/cpu/replay``): a quantized MLP or BERT
replays its noted calls, and every replayed answer equals the kernels' answer on new inputs
(the dynamic models' scales and zero points change with each input)."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.backends.cpu.native import qlinear
from anychip.backends.cpu.replay import run as replay
from bench._wild_cases import _quantize_dynamic, _quantize_static
from bench._wild_models import bert_encoder, bert_feeds, mlp, small_cnn

pytestmark = pytest.mark.skipif(not qlinear.available(), reason="no C compiler here")


@pytest.fixture(autouse=True)
def _no_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay's timing rules off: a busy machine's timings would decide the test."""
    monkeypatch.setattr(replay, "SLOW_NODE", float("inf"))
    monkeypatch.setattr(replay, "GAIN", float("inf"))


def _replay_info(sess) -> str:
    return " ".join(str(p.info.get("replay")) for p in sess.placement().partitions)


@pytest.mark.parametrize(
    "make",
    [
        lambda: _quantize_static(mlp(), "qoperator", "u8", False),
        lambda: _quantize_static(mlp(), "qdq", "s8", True),
        lambda: _quantize_dynamic(mlp(), "s8", False),
        lambda: _quantize_dynamic(mlp(), "u8", True),
    ],
    ids=["qoperator", "qdq", "dynamic", "dynamic-u8-per-channel"],
)
def test_replayed_quantized_mlp_equals_its_kernels(make) -> None:
    model = make()
    sess = anychip.load(model, ["cpu"])
    plain = anychip.load(model, ["cpu"], device_options={"cpu": {"replay": False}})
    rng = np.random.default_rng(29)
    for i in range(14):
        x = (rng.standard_normal((16, 32)) * (0.5 + i % 4)).astype(np.float32)
        (got,) = sess.run(None, {"x": x})
        (want,) = plain.run(None, {"x": x})
        np.testing.assert_array_equal(got, want)
    assert "replayed" in _replay_info(sess), _replay_info(sess)


def test_small_quantized_cnn_with_the_replay_on_equals_its_kernels() -> None:
    """A QOperator CNN (its convolutions, pools and softmax re-run through their kernels
    between recorded calls): whatever the replay keeps, the answers are the kernels'."""
    model = _quantize_static(small_cnn(), "qoperator", "u8", False)
    sess = anychip.load(model, ["cpu"])
    plain = anychip.load(model, ["cpu"], device_options={"cpu": {"replay": False}})
    rng = np.random.default_rng(5)
    for _ in range(12):
        x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
        for g, w in zip(sess.run(None, {"x": x}), plain.run(None, {"x": x}), strict=True):
            np.testing.assert_array_equal(g, w)


def test_replayed_dynamic_bert_equals_its_kernels() -> None:
    model = _quantize_dynamic(bert_encoder(), "s8", False)
    sess = anychip.load(model, ["cpu"])
    plain = anychip.load(model, ["cpu"], device_options={"cpu": {"replay": False}})
    base = bert_feeds()
    rng = np.random.default_rng(3)
    for _ in range(14):
        feeds = dict(base)
        ids = next(k for k, v in base.items() if v.dtype.kind == "i" and v.max() > 2)
        feeds[ids] = rng.integers(0, int(base[ids].max()) + 1, base[ids].shape).astype(
            base[ids].dtype
        )
        for g, w in zip(sess.run(None, feeds), plain.run(None, feeds), strict=True):
            np.testing.assert_array_equal(g, w)
    assert "replayed" in _replay_info(sess), _replay_info(sess)


def test_kernels_that_quantize_after_a_sealing_callee_unseal() -> None:
    """``QLinearSoftmax`` runs the float softmax (which seals its one C call) and then
    quantizes in numpy: it must unseal, or its replay would skip the quantization (the
    replay's check caught that: "its replay differed from the kernels' run")."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(128, np.uint8), "z"),
        numpy_helper.from_array(np.array(1 / 256, np.float32), "so"),
        numpy_helper.from_array(np.array(0, np.uint8), "zo"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node(
            "QLinearSoftmax", ["q", "s", "z", "so", "zo"], ["m"], domain="com.microsoft",
            axis=-1, opset=13,
        ),
        helper.make_node("DequantizeLinear", ["m", "so", "zo"], ["y"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    sess = anychip.load(model, ["cpu"])
    plain = anychip.load(model, ["cpu"], device_options={"cpu": {"replay": False}})
    rng = np.random.default_rng(8)
    for _ in range(10):
        x = (rng.standard_normal((2, 3, 4, 4)) * 3).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])
    assert "replayed" in _replay_info(sess), _replay_info(sess)


def test_scales_fed_at_run_time_are_not_replayed_stale() -> None:
    """A ``QLinearMatMul`` and a ``QLinearSigmoid`` whose output scales are graph inputs:
    what their nodes keep depends on them, so a replay must run their kernels again."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(12)
    b = rng.integers(-128, 128, (32, 16), dtype=np.int8)
    inits = [
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.array(0.02, np.float32), "sa"),
        numpy_helper.from_array(np.array(120, np.uint8), "za"),
        numpy_helper.from_array(np.array(0.01, np.float32), "sb"),
        numpy_helper.from_array(np.array(0, np.int8), "zb"),
        numpy_helper.from_array(np.array(128, np.uint8), "zy"),
        numpy_helper.from_array(np.array(0, np.uint8), "zo"),
        numpy_helper.from_array(np.array(1 / 256, np.float32), "so"),
    ]
    nodes = [
        helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["m"]),
        helper.make_node(
            "QLinearSigmoid", ["m", "sy", "zy", "so", "zo"], ["y"], domain="com.microsoft"
        ),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [
            helper.make_tensor_value_info("a", TensorProto.UINT8, [16, 32]),
            helper.make_tensor_value_info("sy", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    sess = anychip.load(model, ["cpu"])
    plain = anychip.load(model, ["cpu"], device_options={"cpu": {"replay": False}})
    a = rng.integers(0, 256, (16, 32), dtype=np.uint8)
    for i in range(12):
        feeds = {"a": a, "sy": np.array(0.05 * (1 + i % 5), np.float32)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], plain.run(None, feeds)[0])
