"""Models and helpers shared by the ``ort:`` tests: seeded random weights and inputs (with
constant fills any two runtimes agree whatever they compute), and onnxruntime's own session
on the whole model as the reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

__all__ = ["mlp", "attention_block", "reference", "feeds_for"]


def _skip_without_ort() -> None:
    import anychip

    rows = {d.name: d for d in anychip.devices()}
    if "ort:cpu" not in rows or not rows["ort:cpu"].available:
        pytest.skip(f"ort:cpu unavailable: {rows.get('ort:cpu') and rows['ort:cpu'].reason}")


@pytest.fixture(autouse=True)
def _ort_available() -> None:
    _skip_without_ort()


def _w(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    return nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def mlp(seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """x[N, 16] -> MatMul -> Add -> Relu -> Tanh -> MatMul -> Add -> Softmax -> y[N, 4];
    node names n_mm1, n_add1, n_relu, n_tanh, n_mm2, n_add2, n_sm (N symbolic)."""
    rng = np.random.default_rng(seed)
    nodes = [
        h.make_node("MatMul", ["x", "w1"], ["a"], name="n_mm1"),
        h.make_node("Add", ["a", "b1"], ["b"], name="n_add1"),
        h.make_node("Relu", ["b"], ["c"], name="n_relu"),
        h.make_node("Tanh", ["c"], ["d"], name="n_tanh"),
        h.make_node("MatMul", ["d", "w2"], ["e"], name="n_mm2"),
        h.make_node("Add", ["e", "b2"], ["f"], name="n_add2"),
        h.make_node("Softmax", ["f"], ["y"], axis=-1, name="n_sm"),
    ]
    weights = [
        _w(rng, "w1", 16, 32),
        _w(rng, "b1", 32, scale=0.1),
        _w(rng, "w2", 32, 4),
        _w(rng, "b2", 4, scale=0.1),
    ]
    graph = h.make_graph(
        nodes,
        "mlp",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        weights,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def attention_block(seed: int = 1, dim: int = 32, heads: int = 4) -> onnx.ModelProto:
    """One self-attention layer over x[B, S, dim] (B and S symbolic): LayerNorm, Q/K/V
    projections, heads split by Reshape/Transpose, scaled scores, Softmax, output projection,
    residual Add."""
    rng = np.random.default_rng(seed)
    hd = dim // heads
    nodes = [
        h.make_node("LayerNormalization", ["x", "g", "beta"], ["xn"], axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["xn", "wq"], ["q0"]),
        h.make_node("MatMul", ["xn", "wk"], ["k0"]),
        h.make_node("MatMul", ["xn", "wv"], ["v0"]),
        h.make_node("Reshape", ["q0", "split"], ["q1"]),
        h.make_node("Reshape", ["k0", "split"], ["k1"]),
        h.make_node("Reshape", ["v0", "split"], ["v1"]),
        h.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        h.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        h.make_node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        h.make_node("MatMul", ["q", "kt"], ["s0"]),
        h.make_node("Mul", ["s0", "scale"], ["s"]),
        h.make_node("Softmax", ["s"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "v"], ["o0"]),
        h.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", ["o1", "merge"], ["o2"]),
        h.make_node("MatMul", ["o2", "wo"], ["o"]),
        h.make_node("Add", ["o", "x"], ["y"]),
    ]
    weights = [
        nh.from_array((1 + 0.1 * rng.standard_normal(dim)).astype(np.float32), "g"),
        _w(rng, "beta", dim, scale=0.1),
        _w(rng, "wq", dim, dim),
        _w(rng, "wk", dim, dim),
        _w(rng, "wv", dim, dim),
        _w(rng, "wo", dim, dim),
        nh.from_array(np.array([0, 0, heads, hd], np.int64), "split"),
        nh.from_array(np.array([0, 0, dim], np.int64), "merge"),
        nh.from_array(np.array(hd**-0.5, np.float32), "scale"),
    ]
    graph = h.make_graph(
        nodes,
        "attention",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", dim])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", dim])],
        weights,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's own CPU session on the whole model."""
    import onnxruntime

    sess = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return sess.run(None, feeds)


def feeds_for(model: onnx.ModelProto, seed: int, **dims: int) -> dict[str, np.ndarray]:
    """Seeded normal float32 inputs; symbolic dimensions from ``dims``."""
    rng = np.random.default_rng(seed)
    weights = {i.name for i in model.graph.initializer}
    out = {}
    for i in model.graph.input:
        if i.name in weights:
            continue
        shape = [
            d.dim_value if d.HasField("dim_value") else dims[d.dim_param]
            for d in i.type.tensor_type.shape.dim
        ]
        out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out
