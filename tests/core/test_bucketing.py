"""Bucketing with padding (core/compile/bucketing.py): a partition proven safe to pad compiles once
per
bucket and gives the unbucketed results at every length; one not proven safe is not bucketed,
with the reason in its info."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.core.compile.bucketing import analyse, bucket_size, parse_buckets
from anychip.ir.onnx import import_model
from tests.models import transformer_layer

# Counts compiles and telemetry of executables made in memory: the artifact cache off (an
# artifact another test stored would be loaded instead; the disk cache's own tests:
# tests/core/test_compile_cache.py).
pytestmark = pytest.mark.usefixtures("no_compile_cache")


def _token_ffn(seed: int = 0) -> bytes:
    """Per-token layers over x[1, S, 32]: MatMul (S a row axis), Gelu, a head split and merge
    (Reshape copying S with 0), Transpose, LayerNorm over the hidden axis, Div, residual."""
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)

    inits = [
        w("w1", 32, 64),
        w("w2", 64, 32),
        w("g", 32),
        w("b", 32),
        w("d", 32),
        numpy_helper.from_array(np.array([0, 0, 4, 8], np.int64), "split"),
        numpy_helper.from_array(np.array([0, 0, 32], np.int64), "merge"),
    ]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w1"], ["h"]),
        n("Gelu", ["h"], ["a"], domain=""),
        n("MatMul", ["a", "w2"], ["f"]),
        n("Reshape", ["f", "split"], ["hs"]),
        n("Transpose", ["hs"], ["ht"], perm=[0, 2, 1, 3]),
        n("Transpose", ["ht"], ["hb"], perm=[0, 2, 1, 3]),
        n("Reshape", ["hb", "merge"], ["m"]),
        n("Add", ["m", "x"], ["r"]),
        n("LayerNormalization", ["r", "g", "b"], ["ln"], axis=-1),
        n("Div", ["ln", "d"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 32])
    g = helper.make_graph(nodes, "token_ffn", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    return onnx.shape_inference.infer_shapes(m).SerializeToString()


def _x(s: int, hidden: int = 32) -> np.ndarray:
    return np.random.default_rng(s).standard_normal((1, s, hidden)).astype(np.float32)


def _sp(sess: anychip.Session):
    (sp,) = sess.compiled.specialized.values()
    return sp


def _load(model: bytes, buckets: object) -> anychip.Session:
    return anychip.load(
        model,
        devices=["npu", "cpu"],
        cost_model=False,
        background_compile=False,
        device_options={"npu": {"buckets": buckets}},
    )


@pytest.mark.parametrize(("buckets", "expected"), [({"S": "pow2"}, 2), ({"S": [8, 24]}, 2)])
def test_a_safe_graph_compiles_once_per_bucket_and_matches_onnxruntime(buckets, expected):
    model = _token_ffn()
    sess = _load(model, buckets)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert sess.placement().by_device() == {"npu": 10}
    lengths = (5, 7, 8, 6, 13, 16, 11) if buckets["S"] == "pow2" else (5, 7, 8, 13, 20, 24)
    for s in lengths:
        got = sess.run(None, {"x": _x(s)})[0]
        assert got.shape == (1, s, 32)
        want = ref.run(None, {"x": _x(s)})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    t = _sp(sess).telemetry()
    assert t["compiles"] == expected, t  # pow2: 8 and 16; list: 8 and 24
    assert t["hits"] == len(lengths) - expected and t["bucketed_runs"] > 0
    assert "S->" in _sp(sess).info["bucketing"]


def test_bucketed_and_unbucketed_runs_agree_bit_for_bit_in_rows():
    model = _token_ffn(seed=3)
    plain = anychip.load(model, devices=["npu", "cpu"], cost_model=False, background_compile=False)
    sess = _load(model, {"S": "pow2"})
    for s in (3, 9, 17):
        np.testing.assert_allclose(
            sess.run(None, {"x": _x(s)})[0], plain.run(None, {"x": _x(s)})[0], rtol=1e-6, atol=1e-6
        )
    assert _sp(plain).telemetry()["compiles"] == 3 and _sp(sess).telemetry()["compiles"] == 3


def test_attention_over_padded_keys_is_not_bucketed_and_says_why():
    model = transformer_layer(seq="S", hidden=32, heads=2, ffn=64).SerializeToString()
    sess = _load(model, {"S": "pow2"})
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for s in (5, 6, 5):
        np.testing.assert_allclose(
            sess.run(None, {"x": _x(s)})[0],
            ref.run(None, {"x": _x(s)})[0],
            rtol=1e-4,
            atol=1e-5,
        )
    sps = list(sess.compiled.specialized.values())
    why = " ".join(str(sp.info.get("bucketing")) for sp in sps)
    assert "refused: Softmax" in why and "normalizes over the padded axis" in why, why
    assert sum(sp.telemetry()["compiles"] for sp in sps) == 2 * len(sps)  # per length
    assert all(sp.telemetry()["bucketed_runs"] == 0 for sp in sps)


def _graph(nodes, x_shape, y_shape, inits=(), opset=17):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)
    g = helper.make_graph(nodes, "g", [x], [y], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return import_model(onnx.shape_inference.infer_shapes(m)).graph


@pytest.mark.parametrize(
    ("node", "y_shape", "why"),
    [
        (helper.make_node("ReduceSum", ["x", "ax"], ["y"]), [2, 1, 4], "reduces over"),
        (helper.make_node("Softmax", ["x"], ["y"], axis=1), [2, "S", 4], "normalizes over"),
        (helper.make_node("Flatten", ["x"], ["y"], axis=1), [2, None], "reshape"),
        (helper.make_node("Shape", ["x"], ["y"]), [3], "no padding rule"),
        (helper.make_node("MatMul", ["x", "x"], ["y"]), [2, "S", 4], "contracts"),
    ],
)
def test_unsafe_ops_refuse_with_a_reason(node, y_shape, why):
    inits = [numpy_helper.from_array(np.array([1], np.int64), "ax")]
    g = _graph([node], [2, "S", 4], y_shape, inits)
    plan = analyse(g, parse_buckets({"S": "pow2"}))
    assert isinstance(plan, str) and why in plan, plan


def test_safe_ops_carry_the_padded_axis():
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], axis=-1),
        helper.make_node("Transpose", ["s"], ["y"], perm=[1, 0, 2]),
    ]
    plan = analyse(_graph(nodes, [2, "S", 4], ["S", 2, 4]), {"S": "pow2"})
    assert not isinstance(plan, str), plan
    assert plan.inputs == [{1: "S"}] and plan.outputs == [{0: "S"}]
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["w", "t"], ["y"]),  # S is B's column axis
    ]
    plan = analyse(_graph(nodes, [2, "S", 4], [2, 3, "S"], [w]), {"S": "pow2"})
    assert not isinstance(plan, str) and plan.outputs == [{2: "S"}], plan


def test_bucket_sizes_and_bad_options():
    assert [bucket_size("pow2", n) for n in (1, 2, 3, 8, 9)] == [1, 2, 4, 8, 16]
    assert [bucket_size((8, 24), n) for n in (1, 8, 9, 24, 30)] == [8, 8, 24, 24, 30]
    for bad in ({"S": "pow3"}, {"S": []}, {"S": [0]}, [], {"S": "16"}):
        with pytest.raises(anychip.AnychipError, match="buckets"):
            anychip.load(
                _token_ffn(), devices=["npu", "cpu"], device_options={"npu": {"buckets": bad}}
            )


def test_bucketing_with_the_background_compile_switches_over_with_equal_results():
    model = _token_ffn(seed=5)
    sess = anychip.load(
        model,
        devices=["npu", "cpu"],
        cost_model=False,
        background_compile=True,
        device_options={"npu": {"buckets": {"S": "pow2"}}},
    )
    first = sess.run(None, {"x": _x(6)})[0]  # on the host, traced at the bucket (8)
    sp = _sp(sess)
    assert sp.wait(60)
    second = sess.run(None, {"x": _x(7)})[0]  # the same bucket: compiled, a hit
    t = sp.telemetry()
    assert (t["compiles"], t["hits"], t["host_runs"], t["bucketed_runs"]) == (1, 1, 1, 2), t
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(first, ref.run(None, {"x": _x(6)})[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(second, ref.run(None, {"x": _x(7)})[0], rtol=1e-4, atol=1e-5)
    assert "bucketing=S->pow2" in str(sess.placement())
