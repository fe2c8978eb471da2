"""CUDA graphs in the runtime: ``Backend.runner`` is how a device runs its
kernel-mode partitions (checked here on a real array-API backend over NumPy), and the CUDA
backend's wrapper captures a static partition after its warm-up runs and replays it; the
capture itself (``CapturedPartition``) needs a GPU, so a stand-in records it here."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.backends.arrayapi import ArrayAPIBackend, register_backend
from anychip.backends.cuda import graphs
from anychip.backends.cuda.backend import CudaBackend
from anychip.backends.cuda.probe import GpuInfo
from anychip.core.plugin.host import unregister_plugin
from anychip.ir import DType, Value


def _model(batch: int | str) -> bytes:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


class _Wrapping(ArrayAPIBackend):
    """NumPy's namespace as a backend that counts the runs of its wrapped partitions."""

    def runner(self, partition, memory):
        program = memory.runner

        def counted(tensors):
            self.runs += 1
            return program(tensors)

        self.wrapped += 1
        return counted


def test_a_device_runs_its_kernel_mode_partitions_through_its_runner():
    b = _Wrapping("np-wrap", np, auto_select=False)
    b.runs = b.wrapped = 0
    name = register_backend(b, name="test-np-wrap")
    try:
        model = _model(3)
        x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
        (ref,) = ort.InferenceSession(model).run(None, {"x": x})
        sess = anychip.load(model, devices=["np-wrap"], strict=True)
        for _ in range(3):
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-6)
        assert (b.wrapped, b.runs) == (1, 3)
    finally:
        unregister_plugin(name)


class _Capture:
    """Stands in for ``CapturedPartition`` (which needs a GPU): records what it captured."""

    made: list = []

    def __init__(self, program, state, examples) -> None:
        self.program, self.state, self.key = program, state, graphs.signature(examples)
        self.replayed = 0
        _Capture.made.append(self)

    def __call__(self, tensors):
        self.replayed += 1
        return self.program(tensors)


def _memory(program) -> SimpleNamespace:
    """A partition's memory as the runner hook sees it: its plain run."""
    return SimpleNamespace(runner=program)


def _partition(shape: list) -> SimpleNamespace:
    return SimpleNamespace(graph=SimpleNamespace(inputs=[Value("x", DType.FLOAT, shape)]))


@pytest.fixture
def cuda(monkeypatch):
    from anychip.backends.cuda import backend

    monkeypatch.setattr(backend, "_state", lambda info: SimpleNamespace(info=info))  # no CuPy
    return CudaBackend("cuda:0", GpuInfo(0, "x", 1 << 30, 10, 1_000_000, 1_000_000, 256, (8, 0)))


def test_a_static_partition_is_captured_after_its_warmup_and_replayed(cuda, monkeypatch):
    monkeypatch.setattr(graphs, "CapturedPartition", _Capture)
    _Capture.made.clear()
    calls = []
    program = cuda.runner(_partition([2, 5]), _memory(lambda ts: calls.append(1) or ts))
    assert isinstance(program, graphs.ReplayedPartition)
    x = [np.zeros((2, 5), np.float32)]
    for _ in range(graphs.WARMUP):
        program(x)
    assert _Capture.made == []  # warm-up: plain runs
    for _ in range(3):
        program(x)
    (cap,) = _Capture.made
    assert cap.replayed == 3 and program.replays == 3
    program([np.zeros((4, 5), np.float32)])  # other shapes: a plain run, no second capture
    assert len(_Capture.made) == 1 and program.calls == graphs.WARMUP + 2


def test_dynamic_partitions_and_failed_captures_run_as_they_are(cuda, monkeypatch):
    def program(ts):
        return ts

    assert cuda.runner(_partition(["N", 5]), _memory(program)) is program

    def broken(*args):
        raise RuntimeError("stream capture unsupported")

    monkeypatch.setattr(graphs, "CapturedPartition", broken)
    wrapped = cuda.runner(_partition([2, 5]), _memory(program))
    x = [np.ones((2, 5), np.float32)]
    for _ in range(graphs.WARMUP + 3):
        assert wrapped(x) is x
    assert wrapped.failed.startswith("RuntimeError: stream capture") and wrapped.replays == 0


def test_cuda_graphs_can_be_turned_off(cuda, monkeypatch):
    monkeypatch.setattr(graphs, "CapturedPartition", _Capture)
    monkeypatch.setenv("ANYCHIP_CUDA_GRAPHS", "0")
    _Capture.made.clear()
    program = cuda.runner(_partition([2, 5]), _memory(lambda ts: ts))
    for _ in range(graphs.WARMUP + 2):
        program([np.zeros((2, 5), np.float32)])
    assert _Capture.made == []
