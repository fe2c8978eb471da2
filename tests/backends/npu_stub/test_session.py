"""The NPU inside sessions: placement, partitions, copies, numerics against the CPU backend."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

import anychip
from tests.backends.npu_stub.conftest import convnet

# Counts compiles and telemetry of executables made in memory: the artifact cache off (an
# artifact another test stored would be loaded instead; the disk cache's own tests:
# tests/core/test_compile_cache.py).
pytestmark = pytest.mark.usefixtures("no_compile_cache")


def _load(model, devices, **kw):
    return anychip.load(model, devices=devices, cost_model=False, **kw)


def test_convnet_on_npu_matches_cpu(x):
    model = convnet()
    npu = _load(model, ["npu", "cpu"])
    cpu = _load(model, ["cpu"])
    (got,) = npu.run(None, {"x": x})
    (want,) = cpu.run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-4)
    report = npu.placement()
    convs = [n for n in report.nodes if n.op_type == "Conv"]
    assert convs and all(n.device == "npu" for n in convs)
    (part,) = report.partitions
    assert part.device == "npu"
    info = part.info
    assert info["fused_ops"] == 2 and info["precision"] == "fp32"
    # The session folded the BatchNormalization before placement (12 nodes -> 11); the NPU
    # fused two Conv+Relu pairs (-2) and put a layout Transpose at each edge (+2).
    assert npu.optimizations == {"fold_batch_norm": 1}
    assert info["nodes_after_passes"] == info["nodes_before_passes"] == 11
    assert info["weights_bytes"] > 0
    assert info["activation_bytes"] >= info["activation_lower_bound"] > 0
    assert [(c.tensor, c.src, c.dst) for c in report.copies] == [
        ("x", "cpu", "npu"),
        ("y", "npu", "cpu"),
    ]


def test_fp16_is_close_and_reported(x):
    model = convnet()
    want = _load(model, ["cpu"]).run(None, {"x": x})[0]
    sess = _load(model, ["npu", "cpu"], device_options={"npu": {"precision": "fp16"}})
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3)
    assert not np.array_equal(got, want)  # the fp16 datapath really rounds
    assert sess.placement().partitions[0].info["precision"] == "fp16"


def test_unsupported_op_splits_into_npu_cpu_npu(x):
    model = convnet(middle=[h.make_node("Sin", ["p1"], ["m"], name="sin")])
    sess = _load(model, ["npu", "cpu"])
    got = sess.run(None, {"x": x})[0]
    want = _load(model, ["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    report = sess.placement()
    assert [p.device for p in report.partitions] == ["npu", "cpu", "npu"]
    sin = next(n for n in report.nodes if n.op_type == "Sin")
    assert sin.device == "cpu" and "op Sin not in the NPU op set" in sin.reason
    moved = {(c.tensor, c.src, c.dst) for c in report.copies}
    assert {("p1", "npu", "cpu"), ("m", "cpu", "npu")} <= moved
    # p1 is read by both NPU partitions: it is copied back to the host only once.
    assert ("p1", "npu", "npu") not in moved


def test_a_dynamic_shape_runs_on_the_npu_compiled_per_signature():
    node = h.make_node("Relu", ["x"], ["y"], name="relu")
    graph = h.make_graph(
        [node],
        "dyn",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    sess = _load(model, ["npu", "cpu"])
    (rec,) = sess.placement().nodes
    assert rec.device == "npu"  # symbolic dims: the NPU's shape policy is "static"
    rng = np.random.default_rng(0)
    for n in (1, 4, 1, 4):
        xs = rng.standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": xs})[0], np.maximum(xs, 0))
    (sp,) = sess.compiled.specialized.values()
    assert sp.telemetry()["compiles"] == 2 and sp.telemetry()["hits"] == 2


def test_too_small_memory_falls_back_to_cpu(x):
    model = convnet()
    sess = _load(model, ["npu", "cpu"], device_options={"npu": {"memory": 4096}})
    report = sess.placement()
    assert all(n.device == "cpu" for n in report.nodes)
    assert any("out of memory" in n.reason for n in report.nodes)
    want = _load(model, ["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5)


def test_device_options_and_env(monkeypatch):
    from anychip.backends.npu_stub.backend import NpuBackend
    from anychip.errors import DeviceError

    monkeypatch.setenv("ANYCHIP_NPU_MEMORY", "64M")
    assert NpuBackend().device.memory_capacity == 64 << 20
    npu = NpuBackend().configure(memory=1 << 20, precision="FP16")
    assert npu.device.memory_capacity == 1 << 20 and npu.precision == "fp16"
    assert NpuBackend().device_model().memory_capacity == 64 << 20
    with pytest.raises(DeviceError, match="unknown device option"):
        NpuBackend().configure(speed=3)
    with pytest.raises(DeviceError, match="precision must be one of"):
        NpuBackend().configure(precision="int8")
    monkeypatch.setenv("ANYCHIP_NPU_MEMORY", "lots")
    with pytest.raises(DeviceError, match="ANYCHIP_NPU_MEMORY"):
        _ = NpuBackend().capacity


def test_device_model_figures():
    from anychip.backends.npu_stub.backend import NpuBackend
    from anychip.ir.dtypes import DType

    npu = NpuBackend(memory=1 << 20)
    dm = npu.device_model()
    assert (dm.name, dm.kind, dm.memory_capacity) == ("npu", "npu", 1 << 20)
    assert dm.dtypes == {DType.FLOAT, DType.FLOAT16, DType.INT64, DType.INT32, DType.BOOL}
    assert (dm.flops, dm.mem_bandwidth, dm.host_link, dm.launch_overhead) == (
        2e11,
        5e10,
        8e9,
        2e-5,
    )
    assert npu.priority == 20 and npu.graph_mode


def test_a_gpt_like_layer_runs_whole_on_the_npu_like_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    from tests.models import transformer_layer

    model = transformer_layer(seq=16, hidden=64, heads=4, ffn=128, causal=True)
    data = model.SerializeToString()
    x = np.random.default_rng(5).standard_normal((1, 16, 64)).astype(np.float32)
    sess = anychip.load(data, devices=["npu", "cpu"], cost_model=False, background_compile=False)
    assert sess.placement().by_device() == {"npu": 28}
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)
