"""A model whose parts run fastest on different devices: the demo of placement that pays.

``attention_mix`` is GPT-2's pre-LayerNorm block, as its ONNX export writes it, built with
``onnx.helper`` and seeded numpy weights (no downloads). Every node can run on the CPU and on
the XPU, so each device alone is a real alternative. Its parts favour different devices: the
attention (MatMul, scale, Softmax, MatMul) is one kernel on both after their fusion passes,
and the XPU's keeps each block of scores in cache on 2 threads
(``backends/xpu_stub/driver/kernels_attention.c``) where the CPU's materializes them and runs
numpy's matmul at one BLAS thread; the head-split Transposes and LayerNormalization are
cheaper on the XPU too. The weight products (oneDNN, packed weights) and the GELU chain (one
fused element-wise kernel on the CPU, nine launches on the XPU) favour the CPU. The measured
cost model splits the block by itself and the session's feedback keeps the split because it
measures faster: ``python bench/placement.py --models attention_mix,attention_long --sets
"cpu;xpu,cpu"`` (``attention_long``: sequence 512, where the attention's share is larger).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["attention_mix"]


def _w(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.05) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _i64(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _attention(b: int, s: int, d: int, heads: int) -> tuple[list, list]:
    """q, k, v -> ctx ([b, s, d]): heads split, scores, Softmax, weighted sum, heads joined."""
    dh = d // heads
    n = helper.make_node
    nodes = [
        n("Reshape", ["q", "heads_shape"], ["q4"]),
        n("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),  # [b, h, s, dh]
        n("Reshape", ["k", "heads_shape"], ["k4"]),
        n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),  # [b, h, dh, s]
        n("Reshape", ["v", "heads_shape"], ["v4"]),
        n("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        n("MatMul", ["qh", "kt"], ["scores"]),
        n("Mul", ["scores", "scale"], ["scaled"]),
        n("Softmax", ["scaled"], ["probs"], axis=-1),
        n("MatMul", ["probs", "vh"], ["ctx_h"]),
        n("Transpose", ["ctx_h"], ["ctx_t"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_t", "model_shape"], ["ctx"]),
    ]
    inits = [
        _i64("heads_shape", [b, s, heads, dh]),
        _i64("model_shape", [b, s, d]),
        numpy_helper.from_array(np.array(1.0 / np.sqrt(dh), np.float32), "scale"),
    ]
    return nodes, inits


def _gelu_tanh(x: str, y: str) -> tuple[list, list]:
    """y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as GPT-2 exports write it."""
    n = helper.make_node
    nodes = [
        n("Pow", [x, "three"], [f"{x}_cube"]),
        n("Mul", [f"{x}_cube", "c044"], [f"{x}_c"]),
        n("Add", [x, f"{x}_c"], [f"{x}_in"]),
        n("Mul", [f"{x}_in", "c079"], [f"{x}_s"]),
        n("Tanh", [f"{x}_s"], [f"{x}_t"]),
        n("Add", [f"{x}_t", "one"], [f"{x}_t1"]),
        n("Mul", [x, f"{x}_t1"], [f"{x}_xt"]),
        n("Mul", [f"{x}_xt", "half"], [y]),
    ]
    consts = {"three": 3.0, "c044": 0.044715, "c079": float(np.sqrt(2 / np.pi)), "one": 1.0}
    consts["half"] = 0.5
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    return nodes, inits


def attention_mix(
    batch: int = 4, seq: int = 128, d: int = 256, heads: int = 8, seed: int = 0
) -> bytes:
    """GPT-2's pre-LayerNorm block: LayerNorm, q/k/v projections, attention, output
    projection plus residual; LayerNorm, a 4x feed-forward with the tanh GELU plus residual.
    Input and output ``[batch, seq, d]``."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "g1", "c1"], ["xn"], axis=-1, epsilon=1e-5)]
    nodes += [n("MatMul", ["xn", f"w{p}"], [p]) for p in ("q", "k", "v")]
    inits = [_w(rng, f"w{p}", d, d) for p in ("q", "k", "v")]
    inits += [_w(rng, "g1", d, scale=1.0), _w(rng, "c1", d), _w(rng, "g2", d, scale=1.0)]
    inits += [_w(rng, "c2", d)]
    att_nodes, att_inits = _attention(batch, seq, d, heads)
    nodes += att_nodes
    inits += att_inits
    nodes += [
        n("MatMul", ["ctx", "wo"], ["proj"]),
        n("Add", ["proj", "x"], ["h"]),
        n("LayerNormalization", ["h", "g2", "c2"], ["hn"], axis=-1, epsilon=1e-5),
        n("MatMul", ["hn", "w1"], ["f1"]),
        n("Add", ["f1", "b1"], ["f1b"]),
    ]
    inits += [_w(rng, "wo", d, d), _w(rng, "w1", d, 4 * d), _w(rng, "b1", 4 * d)]
    gelu_nodes, gelu_inits = _gelu_tanh("f1b", "g")
    nodes += gelu_nodes
    inits += gelu_inits
    nodes += [n("MatMul", ["g", "w2"], ["f2"]), n("Add", ["f2", "h"], ["y"])]
    inits += [_w(rng, "w2", 4 * d, d)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, d])
    g = helper.make_graph(nodes, "attention_mix", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m).SerializeToString()
