"""The simulated NPU computes on one host thread: its executable runs with numpy's OpenBLAS at
one thread and puts the caller's count back after, so no BLAS workers are left spinning on the
cores the host device runs on next (they slowed the CPU alone's runs after an NPU run 2-4x)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.npu_stub import compiler
from anychip.core.run.blas import openblas_threads


def test_the_npu_executable_runs_with_openblas_at_one_thread(monkeypatch) -> None:
    found = openblas_threads()
    if found is None:
        pytest.skip("numpy's BLAS here is not OpenBLAS")
    get, put = found
    seen: list[int] = []
    run = compiler.NpuExecutable.run

    def recording(self, inputs):
        seen.append(get())
        return run(self, inputs)

    monkeypatch.setattr(compiler.NpuExecutable, "run", recording)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 48])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = get()
    try:
        put(2)
        sess = anychip.load(model, devices=["npu"], strict=True, background_compile=False)
        x = rng.standard_normal((32, 64)).astype(np.float32)
        y = sess.run(None, {"x": x})[0]
        assert seen == [1] and get() == 2
    finally:
        put(before)
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(y, ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
