"""Fixtures of the OpenVINO backend tests: ``openvino:cpu`` is a real device wherever the test
extra is installed (it has openvino), so a missing one fails, it is never skipped; models
built with onnx.helper from seeded random weights; onnxruntime as the reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

DEVICE = "openvino:cpu"


@pytest.fixture(scope="session")
def ov_cpu():
    """The ``openvino:cpu`` backend (available, or the test fails with the reason)."""
    from anychip.core.plugin.host import get_registry

    backend = get_registry([DEVICE]).backends[DEVICE]
    ok, why = backend.available()
    assert ok, f"openvino:cpu is not available: {why} (openvino is in the test extra)"
    return backend


def weight(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.2):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    """An ONNX model from helper parts: ``inputs``/``outputs`` as (name, elem type, shape)."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(inits),
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    if all(shape is not None for _, _, shape in outputs):  # the checker wants typed outputs
        onnx.checker.check_model(m)
    return m


def reference(m: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """onnxruntime's outputs (CPU provider, every optimization)."""
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def cnn(batch: int | str = 2, seed: int = 0) -> onnx.ModelProto:
    """Conv-BatchNorm-Relu-MaxPool, a residual Conv pair, GlobalAveragePool, Flatten, Gemm,
    Softmax; seeded weights."""
    rng = np.random.default_rng(seed)
    f = TensorProto.FLOAT
    n = helper.make_node
    inits = [
        weight(rng, "w1", 8, 3, 3, 3, scale=0.3),
        weight(rng, "b1", 8, scale=0.1),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "s1"),
        weight(rng, "o1", 8, scale=0.1),
        weight(rng, "m1", 8, scale=0.1),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "v1"),
        weight(rng, "w2", 8, 8, 3, 3),
        weight(rng, "w3", 8, 8, 3, 3),
        weight(rng, "wg", 10, 8, scale=0.3),
        weight(rng, "bg", 10, scale=0.1),
    ]
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("BatchNormalization", ["c1", "s1", "o1", "m1", "v1"], ["bn"]),
        n("Relu", ["bn"], ["r1"]),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        n("Relu", ["c2"], ["r2"]),
        n("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        n("Add", ["c3", "p1"], ["res"]),
        n("GlobalAveragePool", ["res"], ["gap"]),
        n("Flatten", ["gap"], ["flat"]),
        n("Gemm", ["flat", "wg", "bg"], ["logits"], transB=1),
        n("Softmax", ["logits"], ["y"], axis=-1),
    ]
    return model(
        nodes,
        [("x", f, [batch, 3, 16, 16])],
        [("y", f, [batch, 10]), ("logits", f, [batch, 10])],
        inits,
        17,
    )
