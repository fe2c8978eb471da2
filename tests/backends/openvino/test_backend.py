"""The ``openvino:*`` devices: listing, options, capability, compiled bytes, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.backends.openvino import driver
from anychip.backends.openvino.backend import OpenVINOBackend
from anychip.errors import DeviceError
from anychip.ir.onnx import import_model
from tests.backends.openvino.conftest import DEVICE, cnn, model, reference, weight

pytestmark = pytest.mark.usefixtures("ov_cpu")


def test_devices_listed_with_version_and_reasons():
    rows = {d.name: d for d in anychip.devices()}
    cpu = rows[DEVICE]
    assert cpu.available and cpu.graph_mode and cpu.kind == "openvino"
    assert cpu.about.startswith("OpenVINO 20")
    for name, family in (("openvino:gpu", "GPU"), ("openvino:npu", "NPU")):
        row = rows[name]
        if family not in " ".join(driver.device_ids()):
            assert not row.available and f"finds no {family}" in row.reason


def test_joins_a_default_session_only_when_named():
    from anychip.core.plan.devices import resolve_devices

    assert DEVICE not in resolve_devices(None)
    assert resolve_devices(["openvino:CPU"]) == [DEVICE, "cpu"]


def test_options_are_checked(ov_cpu):
    with pytest.raises(DeviceError, match="known: precision"):
        ov_cpu.configure(speed="max")
    with pytest.raises(DeviceError, match="precision must be one of"):
        ov_cpu.configure(precision="int4")
    with pytest.raises(DeviceError, match="threads must be"):
        ov_cpu.configure(threads=-1)
    b = ov_cpu.configure(precision="FP16", threads=1, config={"NUM_STREAMS": 1})
    assert (b.precision, b.threads) == ("f16", 1)
    assert b.compile_config()["INFERENCE_PRECISION_HINT"] == "f16"
    assert b.compile_config()["INFERENCE_NUM_THREADS"] == 1
    assert ov_cpu.compile_config()["INFERENCE_PRECISION_HINT"] == "f32"  # left as it was
    assert b.cache_tag != ov_cpu.cache_tag


def test_a_device_without_f32_refuses_until_opted_in(monkeypatch):
    """An NPU computes f16: at anychip's default (f32) it refuses every node, saying how to
    opt in; with precision f16 it takes them."""
    real = driver.properties

    def npu_like(device):
        if device == "NPU":
            return {"OPTIMIZATION_CAPABILITIES": ["FP16", "INT8"], "SUPPORTED_PROPERTIES": {}}
        return real(device)

    monkeypatch.setattr(driver, "properties", npu_like)
    npu = OpenVINOBackend("NPU")
    assert npu.shape_policy == "static" and npu.name == "openvino:npu"
    graph = import_model(cnn()).graph
    why = npu.check_node(graph.nodes[0])
    assert "does not compute f32" in why and "'precision': 'f16'" in why
    assert npu.configure(precision="f16")._precision_refusal() is None


def _relu_model():
    f = TensorProto.FLOAT
    n = helper.make_node
    rng = np.random.default_rng(0)
    return model(
        [n("MatMul", ["x", "w"], ["a"]), n("Relu", ["a"], ["y"])],
        [("x", f, ["N", 8])],
        [("y", f, ["N", 8])],
        [weight(rng, "w", 8, 8)],
    )


def test_compiled_bytes_round_trip_and_refusals(ov_cpu):
    m = _relu_model()
    graph = import_model(m).graph
    compiled = ov_cpu.compile(graph)
    data = compiled.serialize()
    assert data.startswith(b"ANYCHIP-OPENVINO")
    loaded = ov_cpu.load_compiled(data)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(loaded.run([x])[0], compiled.run([x])[0])
    np.testing.assert_allclose(loaded.run([x])[0], reference(m, {"x": x})[0], rtol=1e-5)
    with pytest.raises(DeviceError, match="magic"):
        ov_cpu.load_compiled(b"not ours" + data)
    with pytest.raises(DeviceError, match="precision"):
        ov_cpu.configure(precision="bf16").load_compiled(data)
    with pytest.raises(DeviceError):
        ov_cpu.load_compiled(data[: len(data) // 2])


def test_a_second_session_loads_the_compiled_bytes(monkeypatch, tmp_path):
    monkeypatch.setenv("ANYCHIP_COMPILE_CACHE", "1")
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    m = _relu_model()
    x = np.random.default_rng(2).standard_normal((5, 8)).astype(np.float32)
    first = anychip.load(m, devices=[DEVICE], strict=True)
    second = anychip.load(m, devices=[DEVICE], strict=True)
    (p1,), (p2,) = first.placement().partitions, second.placement().partitions
    assert "compile_ms" in p1.info and "load_ms" in p2.info
    np.testing.assert_array_equal(first.run(None, {"x": x})[0], second.run(None, {"x": x})[0])
    assert list(tmp_path.rglob("*.bin"))


def test_a_partition_openvino_cannot_compile_goes_to_the_cpu(monkeypatch):
    """A compile that raises: the partition's nodes are placed again without openvino:cpu,
    with OpenVINO's reason in the report."""
    from anychip.backends.openvino import compiler

    real = compiler.compile_partition

    def refuse_softmax(graph, *args, **kwargs):
        if any(n.op_type == "Softmax" for n in graph.nodes):
            raise DeviceError("openvino:cpu: OpenVINO cannot compile it (a stand-in refusal)")
        return real(graph, *args, **kwargs)

    monkeypatch.setattr(compiler, "compile_partition", refuse_softmax)
    m = cnn()
    x = np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)
    sess = anychip.load(m, devices=[DEVICE, "cpu"], cost_model=False)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], reference(m, {"x": x})[0], rtol=1e-4)
    report = sess.placement()
    softmax = next(n for n in report.nodes if n.op_type == "Softmax")
    assert softmax.device == "cpu" and "stand-in refusal" in softmax.reason
    with pytest.raises(DeviceError, match="stand-in refusal"):
        anychip.load(m, devices=[DEVICE], strict=True)


def test_int64_only_where_bounded():
    """int64 arithmetic on the model's inputs stays on the CPU (OpenVINO would wrap it to
    int32); int64 derived from shapes goes to OpenVINO."""
    i64, f = TensorProto.INT64, TensorProto.FLOAT
    n = helper.make_node
    m = model(
        [
            n("Add", ["a", "b"], ["s"]),
            n("Shape", ["x"], ["shape"]),
            n("Mul", ["shape", "two"], ["shape2"]),
            n("Reshape", ["x", "shape2"], ["y"], allowzero=0),
        ],
        [("a", i64, [2]), ("b", i64, [2]), ("x", f, [1, 4])],
        [("s", i64, [2]), ("shape2", i64, [2])],
        [helper.make_tensor("two", i64, [2], [1, 1])],
    )
    feeds = {
        "a": np.array([2**40 + 1, 3], np.int64),
        "b": np.array([2**40, -5], np.int64),
        "x": np.ones((1, 4), np.float32),
    }
    sess = anychip.load(m, devices=[DEVICE, "cpu"], cost_model=False)
    s, shape2 = sess.run(None, feeds)
    assert s.tolist() == [2**41 + 1, -2] and shape2.tolist() == [1, 4]
    placed = {r.op_type: r for r in sess.placement().nodes}
    assert placed["Add"].device == "cpu" and "int64" in placed["Add"].reason
    assert placed["Mul"].device == DEVICE


def test_capability_asks_openvino_in_batches(ov_cpu):
    """One probe answers a graph's nodes at once; a node OpenVINO does not convert (Det) is
    found by splitting the batch, with OpenVINO's message."""
    from anychip.backends.openvino.capability import Prober

    f = TensorProto.FLOAT
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r0"])]
    for i in range(1, 24):
        op = ("Sigmoid", "Tanh", "Abs", "Neg")[i % 4]
        nodes.append(n(op, [f"r{i - 1}"], [f"r{i}"]))
    nodes.append(n("Det", ["r23"], ["d"]))
    m = model(nodes, [("x", f, [3, 3])], [("d", f, [])], opset=22)
    graph = import_model(m).graph
    prober = Prober("CPU")
    answers = {node.op_type: prober.reason(node) for node in graph.nodes}
    det = answers.pop("Det")
    assert det is not None and "does not convert" in det and "Det-22" in det, det
    assert all(a is None for a in answers.values()), answers
    assert prober.probes <= 12
