"""Static-shape devices in practice: one compile per input signature (LRU-bounded), runs on the
host while the device compiles in the background, a failed compile leaves its signature on the
host. The NPU is the static-shape device here."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip

# Counts compiles and telemetry of executables made in memory: the artifact cache off (an
# artifact another test stored would be loaded instead; the disk cache's own tests:
# tests/core/test_compile_cache.py).
pytestmark = pytest.mark.usefixtures("no_compile_cache")


def _mlp(batch: int | str = "N", seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32) * 0.3, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32) * 0.3, "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["l"]),
        helper.make_node("Softmax", ["l"], ["y"], axis=-1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8])
    g = helper.make_graph(nodes, "mlp", [x], [y], [w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    return onnx.shape_inference.infer_shapes(m).SerializeToString()


def _x(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)


def _reference(model: bytes, x: np.ndarray) -> np.ndarray:
    return anychip.load(model, devices=["cpu"]).run(None, {"x": x})[0]


def _sp(sess):
    (sp,) = sess.compiled.specialized.values()
    return sp


def test_one_compile_per_signature_and_hits_after():
    model = _mlp()
    sess = anychip.load(model, devices=["npu", "cpu"], cost_model=False, background_compile=False)
    assert sess.placement().by_device() == {"npu": 4}
    for n in (2, 5, 2, 5, 5):
        np.testing.assert_allclose(
            sess.run(None, {"x": _x(n)})[0], _reference(model, _x(n)), rtol=1e-5, atol=1e-6
        )
    t = _sp(sess).telemetry()
    assert (t["compiles"], t["hits"], t["host_runs"]) == (2, 3, 2)  # first of each: traced
    assert t["compile_seconds"] > 0 and t["cached"] == 2


def test_the_cache_keeps_the_most_recent_signatures():
    sess = anychip.load(
        _mlp(),
        devices=["npu", "cpu"],
        cost_model=False,
        background_compile=False,
        compile_cache_size=2,
    )
    for n in (1, 2, 3, 1):
        sess.run(None, {"x": _x(n)})
    t = _sp(sess).telemetry()
    assert t["compiles"] == 4 and t["evictions"] == 2 and t["cached"] == 2


def test_runs_go_to_the_host_while_the_device_compiles_in_the_background():
    model = _mlp(batch=4)
    sess = anychip.load(model, devices=["npu", "cpu"], cost_model=False, background_compile=True)
    sp = _sp(sess)
    first = sess.run(None, {"x": _x(4)})[0]  # may be served by the host: never waits
    assert sp.wait(timeout=60)
    after = sess.run(None, {"x": _x(4)})[0]
    ref = _reference(model, _x(4))
    np.testing.assert_allclose(first, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after, ref, rtol=1e-5, atol=1e-6)
    t = sp.telemetry()
    assert t["compiles"] == 1 and t["hits"] >= 1 and t["compiling"] == 0


def test_a_signature_that_fails_to_compile_stays_on_the_host():
    model = _mlp()
    sess = anychip.load(
        model,
        devices=["npu", "cpu"],
        cost_model=False,
        background_compile=False,
        device_options={"npu": {"memory": 16384}},
    )
    for n in (64, 64):
        np.testing.assert_allclose(
            sess.run(None, {"x": _x(n)})[0], _reference(model, _x(n)), rtol=1e-5, atol=1e-6
        )
    sp = _sp(sess)
    t = sp.telemetry()
    assert t["failed"] == 1 and t["compiles"] == 0 and t["host_runs"] == 2
    assert "OutOfMemoryError" in sp.info["host_only"]


@pytest.mark.parametrize("bad", [0, -1, "8", True])
def test_a_bad_compile_cache_size_is_an_anychip_error(bad):
    with pytest.raises(anychip.AnychipError, match="compile_cache_size"):
        anychip.load(_mlp(), devices=["npu", "cpu"], compile_cache_size=bad)


def test_a_transformer_layer_with_a_symbolic_sequence_runs_on_the_npu():
    """Issue 13's target on the BERT-like layer: every node on the NPU, one compile per
    sequence length, hits after, results within tolerance of onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    from tests.models import transformer_layer

    model = transformer_layer(seq="S", hidden=64, heads=4, ffn=128).SerializeToString()
    sess = anychip.load(model, devices=["npu", "cpu"], cost_model=False, background_compile=False)
    assert sess.placement().by_device() == {"npu": 27}
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for n in (8, 16, 32, 8, 16, 32):
        x = np.random.default_rng(n).standard_normal((1, n, 64)).astype(np.float32)
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    t = _sp(sess).telemetry()
    assert (t["compiles"], t["hits"], t["host_runs"]) == (3, 3, 3)


def _expand_to_a_computed_shape() -> bytes:
    """TorchScript's pattern: Expand to ``Where(Equal(c, ones * -1), ones, c)``: static inputs,
    but onnx's inference (no data propagation through Where) leaves Expand's shape unknown."""
    c = numpy_helper.from_array(np.array([2, 3], np.int64), "c")
    two = numpy_helper.from_array(np.array([2], np.int64), "two")
    minus = numpy_helper.from_array(np.array(-1, np.int64), "minus")
    nodes = [
        helper.make_node("ConstantOfShape", ["two"], ["ones"], value=helper.make_tensor(
            "one", TensorProto.INT64, [1], [1])),
        helper.make_node("Mul", ["ones", "minus"], ["neg"]),
        helper.make_node("Equal", ["c", "neg"], ["eq"]),
        helper.make_node("Where", ["eq", "ones", "c"], ["shape"]),
        helper.make_node("Expand", ["x", "shape"], ["e"]),
        helper.make_node("Relu", ["e"], ["y"]),
    ]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "expand", [x], [y], [c, two, minus])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_static_inputs_with_shapes_inference_left_unknown_run_on_the_npu():
    """Compiled at load, the NPU read Expand's unknown output shape and failed (the zoo's
    TorchScript exports, strict): once the shape is folded, inference on the partition knows
    it, and the partition is compiled at load."""
    import onnxruntime as ort

    model = _expand_to_a_computed_shape()
    sess = anychip.load(
        model, devices=["npu", "cpu"], strict=True, failover=False, cost_model=False,
        background_compile=False,
    )  # fmt: skip
    x = np.array([[-1.0, 0.5, 2.0]], np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want[0])
    assert sess.placement().by_device() == {"npu": 2}  # Expand and Relu (the rest folded)
    assert not sess.compiled.specialized  # compiled at load, no run on the host


def test_an_expand_to_a_shape_fed_as_an_input_compiles_per_value():
    """Expand's shape an input: one input signature, outputs of the shape its values say. A
    signature traced with ``[3, 3]`` answered ``[1, 1]`` with a 3x3 result (the default,
    background compile); the values of such an input are now part of the key."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 1])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Expand", ["x", "s"], ["y"])], "e", [x, s], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    sess = anychip.load(model, devices=["npu", "cpu"], cost_model=False, background_compile=True)
    assert sess.placement().by_device() == {"npu": 1}
    xv = np.arange(3, dtype=np.float32).reshape(1, 3, 1)
    for shape in ([3, 3], [3, 3], [1, 1], [1, 1], [3, 3]):
        got = sess.run(None, {"x": xv, "s": np.array(shape, np.int64)})[0]
        np.testing.assert_array_equal(got, xv * np.ones([1, *shape], np.float32))
        _sp(sess).wait()
    t = _sp(sess).telemetry()
    assert (t["compiles"] + t["disk_hits"], t["hits"], t["host_runs"]) == (2, 3, 2), t


def test_only_inputs_whose_values_steer_shapes_are_keyed():
    from anychip.core.compile.static_shapes import steering_inputs
    from anychip.ir.onnx import import_model

    nodes = [
        helper.make_node("Shape", ["a"], ["sa"]),
        helper.make_node("Expand", ["x", "sa"], ["e"]),  # a's shape only: not keyed
        helper.make_node("Add", ["k", "k"], ["k2"]),
        helper.make_node("Reshape", ["e", "k2"], ["y"]),  # k's values, through Add: keyed
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
        helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4]),
        helper.make_tensor_value_info("k", TensorProto.INT64, [2]),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", inputs, [y])
    model = import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    assert steering_inputs(model.graph) == [2]


def test_static_inputs_whose_shapes_only_a_run_tells_are_traced_strictly_on_the_npu():
    """Expand's shape an input, the compile at load (background off): inference cannot know
    the output's shape, so the compile failed and strict refused the model. The first run of
    each value traces it; the values are in the key."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 1])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Expand", ["x", "s"], ["y"])], "e", [x, s], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    sess = anychip.load(
        model, devices=["npu", "cpu"], strict=True, failover=False, cost_model=False,
        background_compile=False,
    )  # fmt: skip
    xv = np.arange(3, dtype=np.float32).reshape(1, 3, 1)
    for shape in ([3, 3], [1, 1], [3, 3], [1, 1]):
        got = sess.run(None, {"x": xv, "s": np.array(shape, np.int64)})[0]
        np.testing.assert_array_equal(got, xv * np.ones([1, *shape], np.float32))
    t = _sp(sess).telemetry()
    assert (t["compiles"] + t["disk_hits"], t["hits"], t["host_runs"]) == (2, 2, 2), t
