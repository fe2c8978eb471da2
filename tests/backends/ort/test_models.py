"""Models on ``ort:cpu`` alone and mixed with anychip's ``cpu``, against onnxruntime's own
session on the whole model (seeded random weights and inputs)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as h

import anychip
from anychip.zoo import light_model
from tests.backends.ort.conftest import attention_block, feeds_for, mlp, reference


def _load(model, devices, **kw):
    kw.setdefault("cost_model", False)
    return anychip.load(model, devices=devices, **kw)


def test_an_mlp_runs_whole_on_ort_cpu_at_several_batch_sizes() -> None:
    model = mlp()
    sess = _load(model, ["ort:cpu"], strict=True)
    report = sess.placement()
    assert report.by_device() == {"ort:cpu": 7}, report
    (part,) = report.partitions
    assert part.info["provider"] == "CPUExecutionProvider" and part.info["onnxruntime"]
    for n in (1, 3, 64):  # one session, symbolic N: no recompile per shape
        feeds = feeds_for(model, seed=n, N=n)
        (y,) = sess.run(None, feeds)
        (ref,) = reference(model, feeds)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_an_attention_layer_with_symbolic_batch_and_sequence() -> None:
    model = attention_block()
    sess = _load(model, ["ort:cpu", "cpu"])
    assert sess.placement().by_device() == {"ort:cpu": len(model.graph.node)}
    for b, s in ((1, 7), (2, 16)):
        feeds = feeds_for(model, seed=s, B=b, S=s)
        (y,) = sess.run(None, feeds)
        (ref,) = reference(model, feeds)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_a_light_cnn_whole_and_split_across_ort_cpu_and_cpu() -> None:
    model = light_model("squeezenet", seed=3)
    feeds = feeds_for(model, seed=4)
    (ref,) = reference(model, feeds)
    whole = _load(model, ["ort:cpu", "cpu"])
    by = whole.placement().by_device()
    # Dropout-1 of this old model has a mask of no declared type: onnxruntime infers it
    assert by == {"ort:cpu": len(model.graph.node)}, by
    (y,) = whole.run(None, feeds)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    # every Concat pinned to anychip's cpu: eight islands of onnxruntime between them
    mixed = _load(model, ["ort:cpu", "cpu"], placement={"Concat": "cpu"})
    report = mixed.placement()
    assert report.by_device() == {"ort:cpu": len(model.graph.node) - 8, "cpu": 8}
    assert sum(p.device == "ort:cpu" for p in report.partitions) == 9
    (y,) = mixed.run(None, feeds)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_a_node_onnxruntime_has_no_kernel_for_goes_to_the_cpu_with_the_reason() -> None:
    """onnxruntime's CPU Relu takes no int64 (14+): that Relu runs on anychip's cpu, the float
    layers around it on ort:cpu."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
            h.make_node("Cast", ["a"], ["ai"], to=TensorProto.INT64, name="to_int"),
            h.make_node("Relu", ["ai"], ["r"], name="relu_i64"),
            h.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT, name="to_float"),
            h.make_node("Softmax", ["rf"], ["y"], name="sm"),
        ],
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [anychip_tensor(w, "w")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    feeds = {"x": (rng.standard_normal((3, 6)) * 3).astype(np.float32)}
    sess = _load(model, ["ort:cpu", "cpu"])
    nodes = {n.name: n for n in sess.placement().nodes}
    assert nodes["relu_i64"].device == "cpu"
    assert "onnxruntime's CPU provider Relu-14 kernels do not take" in nodes["relu_i64"].reason
    assert {nodes[n].device for n in ("mm", "to_int", "to_float", "sm")} == {"ort:cpu"}
    (y,) = sess.run(None, feeds)
    # onnxruntime alone cannot run this model (no int64 Relu): anychip's cpu alone is the reference
    (ref,) = anychip.load(model, devices=["cpu"]).run(None, feeds)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def anychip_tensor(array: np.ndarray, name: str):
    from onnx import numpy_helper

    return numpy_helper.from_array(array, name)


def test_bfloat16_and_int4_values_cross_the_partition_edges() -> None:
    """onnxruntime's numpy conversion takes neither: they go through raw bytes (values.py),
    both ways: bfloat16 and int4 made on ort:cpu and read on cpu, int4 made on cpu and read on
    ort:cpu."""
    scale = anychip_tensor(np.array(0.5, np.float32), "s")
    zero = h.make_tensor("z", TensorProto.INT4, [], [1])
    graph = h.make_graph(
        [
            h.make_node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16, name="ort_to_bf16"),
            h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="ort_quant"),
            h.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT, name="cpu_from_bf16"),
            h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="cpu_dequant"),
            h.make_node("QuantizeLinear", ["x", "s", "z"], ["q2"], name="cpu_quant"),
            h.make_node("DequantizeLinear", ["q2", "s", "z"], ["d2"], name="ort_dequant"),
        ],
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
        [
            h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5]),
            h.make_tensor_value_info("b", TensorProto.BFLOAT16, [2, 5]),
            h.make_tensor_value_info("q", TensorProto.INT4, [2, 5]),
            h.make_tensor_value_info("d", TensorProto.FLOAT, [2, 5]),
            h.make_tensor_value_info("d2", TensorProto.FLOAT, [2, 5]),
        ],
        [scale, zero],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])
    x = np.array([[-3.2, -1.0, 0.0, 0.4, 2.6], [5.0, 7.0, -7.0, 1.5, -0.5]], np.float32)
    sess = _load(model, ["ort:cpu", "cpu"], placement={"cpu_*": "cpu"})
    assert sess.placement().by_device() == {"ort:cpu": 3, "cpu": 3}
    y, b, q, d, d2 = sess.run(None, {"x": x})
    assert b.dtype.name == "bfloat16" and q.dtype.name == "int4"
    np.testing.assert_array_equal(b.astype(np.float32), x.astype(b.dtype).astype(np.float32))
    want_q = np.clip(np.rint(x / 0.5) + 1, -8, 7)
    np.testing.assert_array_equal(q.astype(np.int8), want_q)
    np.testing.assert_array_equal(y, b.astype(np.float32))
    np.testing.assert_array_equal(d, (want_q - 1) * 0.5)
    np.testing.assert_array_equal(d2, d)


def test_reports_profile_and_memory_name_the_device() -> None:
    model = mlp()
    sess = _load(model, ["ort:cpu", "cpu"], placement={"n_tanh": "cpu"})
    feeds = feeds_for(model, seed=2, N=5)
    sess.run(None, feeds)
    text = str(sess.placement())
    assert "ort:cpu" in text and "onnxruntime=" in text
    assert "ort:cpu" in str(sess.memory())
    profile = sess.profile(feeds, runs=2)
    assert "ort:cpu" in str(profile)


def test_with_the_cost_model_on_the_answer_is_the_same() -> None:
    model = attention_block(seed=4)
    feeds = feeds_for(model, seed=9, B=2, S=8)
    sess = anychip.load(model, devices=["ort:cpu", "cpu"])
    for _ in range(3):  # the run-time feedback may swap placements: the numbers stay
        (y,) = sess.run(None, feeds)
        np.testing.assert_allclose(y, reference(model, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_option(threads: int) -> None:
    model = mlp(seed=threads)
    feeds = feeds_for(model, seed=1, N=4)
    sess = _load(model, ["ort:cpu"], device_options={"ort:cpu": {"threads": threads}})
    (y,) = sess.run(None, feeds)
    np.testing.assert_allclose(y, reference(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_bad_options_name_what_is_known() -> None:
    with pytest.raises(anychip.DeviceError, match="takes no provider options.*threads"):
        _load(mlp(), ["ort:cpu"], device_options={"ort:cpu": {"device_id": 0}})
    with pytest.raises(anychip.DeviceError, match="threads must be an int"):
        _load(mlp(), ["ort:cpu"], device_options={"ort:cpu": {"threads": "four"}})
    with pytest.raises(anychip.DeviceError, match="optimization must be one of"):
        _load(mlp(), ["ort:cpu"], device_options={"ort:cpu": {"optimization": "max"}})


def test_ort_devices_never_join_a_session_that_names_none() -> None:
    sess = anychip.load(mlp())
    assert not any(d.startswith("ort:") for d in sess.devices)


def test_com_microsoft_ops_run_as_onnxruntime_s_own_kernels() -> None:
    """FusedMatMul, Gelu and SkipLayerNormalization stay whole on ort:cpu (no decomposition)."""
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    ms = "com.microsoft"
    graph = h.make_graph(
        [
            h.make_node("FusedMatMul", ["x", "w"], ["a"], domain=ms, alpha=0.5, transB=1),
            h.make_node("Gelu", ["a"], ["b"], domain=ms),
            h.make_node("SkipLayerNormalization", ["b", "x2", "g", "beta"], ["y"], domain=ms),
        ],
        "g",
        [
            h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
            h.make_tensor_value_info("x2", TensorProto.FLOAT, ["N", 6]),
        ],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
        [
            nh.from_array(rng.standard_normal((6, 8)).astype(np.float32), "w"),
            nh.from_array(rng.standard_normal(6).astype(np.float32), "g"),
            nh.from_array(rng.standard_normal(6).astype(np.float32), "beta"),
        ],
    )
    opsets = [h.make_opsetid("", 17), h.make_opsetid(ms, 1)]
    model = h.make_model(graph, opset_imports=opsets)
    feeds = {
        "x": rng.standard_normal((3, 8)).astype(np.float32),
        "x2": rng.standard_normal((3, 6)).astype(np.float32),
    }
    sess = _load(model, ["ort:cpu", "cpu"])
    assert [(n.op_type, n.device) for n in sess.placement().nodes] == [
        ("FusedMatMul", "ort:cpu"),
        ("Gelu", "ort:cpu"),
        ("SkipLayerNormalization", "ort:cpu"),
    ]
    (y,) = sess.run(None, feeds)
    np.testing.assert_allclose(y, reference(model, feeds)[0], rtol=1e-5, atol=1e-6)
