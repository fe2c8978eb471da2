"""Held-out models for the benchmarks, built in code with seeded random weights: an MLP, a
BERT-like encoder layer, an LSTM, and a small CNN with a dynamic batch."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["mlp", "lstm", "cnn", "HELD_OUT"]


def _w(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.05) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(nodes: list, name: str, ins: list, outs: list, inits: list, opset: int = 17) -> bytes:
    g = helper.make_graph(nodes, name, ins, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(m).SerializeToString()


def mlp(batch: int = 64, width: int = 1024, layers: int = 4, seed: int = 0) -> bytes:
    """``layers`` Gemm + Relu blocks of ``width``, then a 10-way Gemm and Softmax."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        inits += [_w(rng, f"w{i}", width, width), _w(rng, f"b{i}", width)]
        nodes += [
            helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"g{i}"]),
            helper.make_node("Relu", [f"g{i}"], [f"h{i}"]),
        ]
        prev = f"h{i}"
    inits += [_w(rng, "wo", width, 10), _w(rng, "bo", 10)]
    nodes += [
        helper.make_node("Gemm", [prev, "wo", "bo"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])
    return _model(nodes, "mlp", [x], [y], inits)


def lstm(seq: int = 32, batch: int = 8, inp: int = 64, hidden: int = 128, seed: int = 0) -> bytes:
    """One ONNX LSTM over ``seq`` steps, then a Gemm head on the last hidden state."""
    rng = np.random.default_rng(seed)
    inits = [
        _w(rng, "W", 1, 4 * hidden, inp),
        _w(rng, "R", 1, 4 * hidden, hidden),
        _w(rng, "B", 1, 8 * hidden),
        _w(rng, "wo", hidden, 16),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
    ]
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Yh"], hidden_size=hidden),
        helper.make_node("Squeeze", ["Yh", "axes0"], ["h"]),
        helper.make_node("MatMul", ["h", "wo"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, inp])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16])
    return _model(nodes, "lstm", [x], [y], inits)


def cnn(batch: int | str = "N", seed: int = 0) -> bytes:
    """Conv-Relu-MaxPool twice, global pooling and a Gemm head; batch dimension dynamic."""
    rng = np.random.default_rng(seed)
    inits = [
        _w(rng, "c1", 32, 3, 3, 3, scale=0.2),
        _w(rng, "c2", 64, 32, 3, 3, scale=0.08),
        _w(rng, "wo", 64, 10),
        _w(rng, "bo", 10),
    ]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "c1"], ["a1"], pads=[1, 1, 1, 1]),
        n("Relu", ["a1"], ["r1"]),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p1", "c2"], ["a2"], pads=[1, 1, 1, 1]),
        n("Relu", ["a2"], ["r2"]),
        n("GlobalAveragePool", ["r2"], ["g"]),
        n("Flatten", ["g"], ["f"]),
        n("Gemm", ["f", "wo", "bo"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])
    return _model(nodes, "cnn", [x], [y], inits)


def _bert_like() -> bytes:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.models import transformer_layer

    return transformer_layer(seq=128, hidden=256, heads=4, ffn=1024).SerializeToString()


def _gpt_like() -> bytes:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.models import transformer_layer

    layer = transformer_layer(seq=128, hidden=256, heads=4, ffn=1024, seed=1, causal=True)
    return layer.SerializeToString()


#: name -> (model bytes factory, concrete input shape for a dynamic batch, or None)
HELD_OUT = {
    "mlp": (mlp, None),
    "bert_like": (_bert_like, None),
    "gpt_like": (_gpt_like, None),
    "lstm": (lstm, None),
    "cnn_dynamic": (cnn, {"x": (8, 3, 64, 64)}),
}
