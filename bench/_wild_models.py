"""Small models for the wild corpus, built with seeded random weights (no downloads).

A small BERT encoder written the way exporters write Hugging Face BERT (opset 17), so that
onnxruntime's transformer optimizer fuses it into ``com.microsoft`` ops (EmbedLayerNormalization,
Attention, SkipLayerNormalization, BiasGelu/FastGelu)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

__all__ = ["bert_encoder", "bert_feeds", "small_cnn", "mlp"]


class _Builder:
    """Nodes and seeded random initializers of one graph being written."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.inits: list[onnx.TensorProto] = []
        self.nodes: list[onnx.NodeProto] = []

    def w(self, name: str, *shape: int, scale: float = 0.1) -> str:
        value = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(nh.from_array(value, name))
        return name

    def c(self, name: str, value: np.ndarray) -> str:
        self.inits.append(nh.from_array(value, name))
        return name

    def node(self, op: str, ins: list[str], out: str, **attrs: object) -> str:
        self.nodes.append(h.make_node(op, ins, [out], name=out, **attrs))
        return out


def _embeddings(b: _Builder, hidden: int, seq: int, vocab: int) -> str:
    words = b.node("Gather", [b.w("word", vocab, hidden), "input_ids"], "e_word")
    pos = b.node("Gather", [b.w("pos", seq, hidden), "pos_ids"], "e_pos")
    seg = b.node("Gather", [b.w("seg", 2, hidden), "token_type_ids"], "e_seg")
    s = b.node("Add", [b.node("Add", [words, pos], "e_add1"), seg], "e_add2")
    return b.node("LayerNormalization", [s, b.w("eg", hidden), b.w("eb", hidden)], "e_ln",
                  epsilon=1e-12)  # fmt: skip


def _mask(b: _Builder) -> str:
    """HF BERT's additive mask: (1 - mask) * -10000, as [batch, 1, 1, seq]."""
    m = b.node("Unsqueeze", ["attention_mask", "ax1"], "m_u1")
    m = b.node("Cast", [b.node("Unsqueeze", [m, "ax2"], "m_u2")], "m_cast", to=T.FLOAT)
    return b.node("Mul", [b.node("Sub", ["one", m], "m_sub"), "neg"], "m_mul")


def _layer(b: _Builder, x: str, mask: str, p: str, hidden: int) -> str:
    def proj(name: str, src: str, width: int) -> str:
        mm = b.node("MatMul", [src, b.w(p + name + "_w", hidden, width)], p + name + "_mm")
        return b.node("Add", [mm, b.w(p + name + "_b", width)], p + name)

    def split(src: str, perm: list[int]) -> str:
        return b.node("Transpose", [b.node("Reshape", [src, "split4"], src + "_r")], src + "_t",
                      perm=perm)  # fmt: skip

    q = split(proj("q", x, hidden), [0, 2, 1, 3])
    k = split(proj("k", x, hidden), [0, 2, 3, 1])
    v = split(proj("v", x, hidden), [0, 2, 1, 3])
    sc = b.node("Div", [b.node("MatMul", [q, k], p + "qk"), "sqrt_h"], p + "scaled")
    probs = b.node("Softmax", [b.node("Add", [sc, mask], p + "masked")], p + "probs", axis=-1)
    ctx = b.node("Transpose", [b.node("MatMul", [probs, v], p + "ctx")], p + "ctx_t",
                 perm=[0, 2, 1, 3])  # fmt: skip
    ctx = b.node("Reshape", [ctx, "merge3"], p + "ctx_r")
    a = b.node("Add", [proj("o", ctx, hidden), x], p + "res1")
    x = b.node("LayerNormalization", [a, b.w(p + "g1", hidden), b.w(p + "b1", hidden)],
               p + "ln1", epsilon=1e-12)  # fmt: skip
    f = proj("f1", x, 4 * hidden)
    erf = b.node("Erf", [b.node("Div", [f, "sqrt2"], p + "gdiv")], p + "erf")
    g = b.node("Mul", [f, b.node("Add", [erf, "one"], p + "gadd")], p + "gmul")
    g = b.node("Mul", [g, "half"], p + "gelu")
    mm = b.node("MatMul", [g, b.w(p + "f2_w", 4 * hidden, hidden)], p + "f2_mm")
    a = b.node("Add", [b.node("Add", [mm, b.w(p + "f2_b", hidden)], p + "f2"), x], p + "res2")
    return b.node("LayerNormalization", [a, b.w(p + "g2", hidden), b.w(p + "b2", hidden)],
                  p + "ln2", epsilon=1e-12)  # fmt: skip


def bert_encoder(
    layers: int = 2, hidden: int = 32, heads: int = 4, seq: int = 8, vocab: int = 50, seed: int = 0
) -> onnx.ModelProto:
    """Inputs ``input_ids``, ``token_type_ids``, ``attention_mask`` (int64 ``[batch, seq]``);
    output ``last_hidden_state``. Weights are seeded random."""
    b = _Builder(seed)
    head = hidden // heads
    b.c("pos_ids", np.arange(seq, dtype=np.int64).reshape(1, seq))
    b.c("split4", np.array([0, 0, heads, head], np.int64))
    b.c("merge3", np.array([0, 0, hidden], np.int64))
    b.c("sqrt_h", np.array(np.sqrt(head), np.float32))
    b.c("one", np.array(1.0, np.float32))
    b.c("neg", np.array(-10000.0, np.float32))
    b.c("sqrt2", np.array(np.sqrt(2.0), np.float32))
    b.c("half", np.array(0.5, np.float32))
    b.c("ax1", np.array([1], np.int64))
    b.c("ax2", np.array([2], np.int64))
    x = _embeddings(b, hidden, seq, vocab)
    mask = _mask(b)
    for i in range(layers):
        x = _layer(b, x, mask, f"l{i}_", hidden)
    b.nodes.append(h.make_node("Identity", [x], ["last_hidden_state"]))
    ids = [
        h.make_tensor_value_info(n, T.INT64, ["batch", seq])
        for n in ("input_ids", "token_type_ids", "attention_mask")
    ]
    out = h.make_tensor_value_info("last_hidden_state", T.FLOAT, ["batch", seq, hidden])
    graph = h.make_graph(b.nodes, "bert", ids, [out], b.inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def bert_feeds(batch: int = 2, seq: int = 8, vocab: int = 50, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[1:, seq - 3 :] = 0  # right padding in all rows but the first
    return {
        "input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64),
        "token_type_ids": (np.arange(seq) >= seq // 2).astype(np.int64)[None].repeat(batch, 0),
        "attention_mask": mask,
    }


def small_cnn(seed: int = 0, size: int = 16) -> onnx.ModelProto:
    """A CNN (opset 17, input ``x [batch, 3, size, size]``) using the ops onnxruntime's static
    quantizer turns into QOperator ops: Conv, Add, Mul, Sigmoid, LeakyRelu, MaxPool,
    AveragePool, Concat, GlobalAveragePool, Gemm, Softmax."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def w(name: str, *shape: int) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        value = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        inits.append(nh.from_array(value.astype(np.float32), name))
        return name

    def node(op: str, ins: list[str], out: str, **attrs: object) -> str:
        nodes.append(h.make_node(op, ins, [out], name=out, **attrs))
        return out

    c1 = node("Conv", ["x", w("w1", 8, 3, 3, 3), w("b1", 8)], "c1", pads=[1, 1, 1, 1])
    r1 = node("Relu", [c1], "r1")
    c2 = node("Conv", [r1, w("w2", 8, 8, 3, 3), w("b2", 8)], "c2", pads=[1, 1, 1, 1])
    s = node("Add", [c2, r1], "res")
    g = node("Mul", [node("Sigmoid", [s], "sig"), s], "swish")
    p = node("MaxPool", [g], "mp", kernel_shape=[2, 2], strides=[2, 2])
    a = node("AveragePool", [p], "ap", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    c3 = node("Conv", [a, w("w3", 8, 8, 1, 1), w("b3", 8)], "c3")
    cat = node("LeakyRelu", [node("Concat", [a, c3], "cat", axis=1)], "lrelu", alpha=0.1)
    flat = node("Flatten", [node("GlobalAveragePool", [cat], "gap")], "flat")
    fc = node("Gemm", [flat, w("wf", 10, 16), w("bf", 10)], "fc", transB=1)
    node("Softmax", [fc], "probs", axis=-1)
    x = h.make_tensor_value_info("x", T.FLOAT, ["batch", 3, size, size])
    y = h.make_tensor_value_info("probs", T.FLOAT, ["batch", 10])
    graph = h.make_graph(nodes, "small_cnn", [x], [y], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def mlp(seed: int = 0, width: int = 64) -> onnx.ModelProto:
    """Three MatMul+Add+Relu layers (input ``x [batch, 32]``), for dynamic quantization."""
    rng = np.random.default_rng(seed)
    inits, nodes, src, n_in = [], [], "x", 32
    for i, n_out in enumerate((width, width, 8)):
        wt = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        inits += [nh.from_array(wt, f"w{i}"), nh.from_array(np.zeros(n_out, np.float32), f"b{i}")]
        nodes.append(h.make_node("MatMul", [src, f"w{i}"], [f"m{i}"]))
        nodes.append(h.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]))
        src, n_in = f"a{i}", n_out
        if i < 2:
            nodes.append(h.make_node("Relu", [src], [f"r{i}"]))
            src = f"r{i}"
    nodes.append(h.make_node("Identity", [src], ["y"]))
    graph = h.make_graph(
        nodes,
        "mlp",
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", 32])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", 8])],
        inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
