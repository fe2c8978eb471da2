"""The ``ort:`` code path with a stand-in vendor provider, all of it but the vendor's call:

* the stand-in is onnxruntime's CPU provider behind a device with memory of its own (the
  ``OrtDevice`` "cpu" where a GPU provider has "cuda"): tensors are ``OrtValue``s, copies are
  real, partitions run through IO binding, and a tensor one partition makes is read by the
  next on the device, without a copy;
* a partition holding a Softmax is loaded on onnxruntime's ``AzureExecutionProvider`` with
  CPU fallback disabled, which takes no node: onnxruntime refuses the partition whole, and
  anychip places all its nodes on the cpu, with onnxruntime's reason.
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

import anychip
from anychip.backends.ort.backend import OrtBackend
from anychip.backends.ort.providers import Provider
from anychip.backends.ort.session import OrtTensor, PartitionRefused, export_partition, open_session
from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.host import get_registry, register_plugin, unregister_plugin
from tests.backends.ort.conftest import reference

STANDIN = Provider("standin", "CPUExecutionProvider", "cpu", "a stand-in with its own memory")


class StandIn(OrtBackend):
    """``ort:standin``: see the module docstring."""

    def __init__(self) -> None:
        super().__init__(STANDIN)
        self.refused: list[str] = []

    def _available(self) -> tuple[bool, str]:
        return True, ""

    def compile(self, graph):
        if any(n.op_type == "Softmax" for n in graph.nodes):
            vendor = dataclasses.replace(self.provider, ep="AzureExecutionProvider")
            try:
                what = f"partition {graph.name!r} ({len(graph.nodes)} nodes)"
                open_session(export_partition(graph), vendor, self.settings, what)
            except PartitionRefused as e:
                self.refused.append(str(e))
                raise
        return super().compile(graph)


class _Plugin:
    def __init__(self) -> None:
        self.backend = StandIn()

    @hookimpl
    def anychip_register_backends(self, registry):
        registry.add_backend(self.backend)


@pytest.fixture
def standin():
    get_registry()
    plugin = _Plugin()
    register_plugin(plugin, "ort.standin")
    try:
        yield get_registry(["ort:standin"]).backends["ort:standin"]
    finally:
        unregister_plugin("ort.standin")


def _model(with_softmax: bool) -> onnx.ModelProto:
    """A -> C (pinned to cpu) -> D(b, c): D reads ``b`` straight from A's partition."""
    rng = np.random.default_rng(7)
    last = (
        [h.make_node("Softmax", ["d0"], ["y"], axis=-1, name="sm")]
        if with_softmax
        else [h.make_node("Tanh", ["d0"], ["y"], name="tanh")]
    )
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
            h.make_node("Relu", ["a"], ["b"], name="relu"),
            h.make_node("Sigmoid", ["b"], ["c"], name="on_cpu"),
            h.make_node("Mul", ["b", "c"], ["d"], name="mul"),
            h.make_node("MatMul", ["d", "w2"], ["d0"], name="mm2"),
            *last,
        ],
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [
            nh.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w1"),
            nh.from_array(rng.standard_normal((6, 3)).astype(np.float32), "w2"),
        ],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_tensors_stay_on_the_device_between_its_partitions(standin) -> None:
    model = _model(with_softmax=False)
    sess = anychip.load(
        model, devices=["ort:standin", "cpu"], cost_model=False, placement={"on_cpu": "cpu"}
    )
    report = sess.placement()
    assert report.by_device() == {"ort:standin": 5, "cpu": 1}, report
    copies = {(c.tensor, c.src, c.dst) for c in report.copies}
    # b goes to the cpu for the Sigmoid and stays on the device for the Mul: no copy back
    assert ("b", "ort:standin", "cpu") in copies
    assert not any(v == "b" and dst == "ort:standin" for v, _, dst in copies), copies
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    stats = standin.memory_stats()
    assert stats.peak > 0 and stats.in_use == 0  # every device tensor was released
    assert stats.alloc_count == stats.free_count > 0


def test_copies_in_and_out_are_real(standin) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = standin.to_device(a[:, ::2])  # a strided view
    assert isinstance(t, OrtTensor) and t.shape == (3, 2)
    a[:] = -1  # the device holds its own bytes
    np.testing.assert_array_equal(standin.to_host(t), np.arange(12).reshape(3, 4)[:, ::2])
    for odd in (np.zeros((0, 3), np.float32), np.array(5, np.int64), np.array([True])):
        u = standin.to_device(odd)
        back = standin.to_host(u)
        assert back.shape == odd.shape and back.dtype == odd.dtype
        np.testing.assert_array_equal(back, odd)
        standin.release(u)
    standin.release(t)
    assert standin.memory_stats().in_use == 0


def test_a_partition_the_provider_refuses_is_placed_elsewhere_whole(standin) -> None:
    model = _model(with_softmax=True)
    sess = anychip.load(
        model, devices=["ort:standin", "cpu"], cost_model=False, placement={"on_cpu": "cpu"}
    )
    # the refused partition held mul, mm2 and sm: all three moved, not the Softmax alone
    nodes = {n.name: n for n in sess.placement().nodes}
    assert {n: nodes[n].device for n in nodes} == {
        "mm1": "ort:standin",
        "relu": "ort:standin",
        "on_cpu": "cpu",
        "mul": "cpu",
        "mm2": "cpu",
        "sm": "cpu",
    }
    for name in ("mul", "mm2", "sm"):
        reason = nodes[name].reason
        assert "compile failed on partition" in reason and "PartitionRefused" in reason, reason
        assert "does not take" in reason and "whole on AzureExecutionProvider" in reason
    assert "fallback to CPU EP has been explicitly disabled" in standin.refused[0]
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    del sess
    gc.collect()
    assert standin.memory_stats().in_use == 0


def test_strict_turns_the_refusal_into_an_error_with_the_reason(standin) -> None:
    with pytest.raises(anychip.AnychipError, match="does not take .* whole"):
        anychip.load(_model(with_softmax=True), devices=["ort:standin"], strict=True)


def test_a_feed_that_is_not_a_device_tensor_is_an_error_naming_it(standin) -> None:
    from anychip.backends.ort.session import BoundRun

    model = _model(with_softmax=False)
    sess = anychip.load(model, devices=["ort:standin", "cpu"], cost_model=False)
    run = next(p.program for p in sess.compiled.partitions if isinstance(p.program, BoundRun))
    with pytest.raises(anychip.DeviceError, match="input 'x' is a ndarray, not a tensor"):
        run([np.zeros((1, 8), np.float32)])
