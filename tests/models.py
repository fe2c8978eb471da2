"""Small models built in code for tests and benchmarks: a transformer encoder layer; onnx's
light CNNs with seeded random weights, made once per process."""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["light", "transformer_layer"]


def light(name: str, seed: int = 0) -> onnx.ModelProto:
    """``anychip.zoo.light_model(name, seed)``, a fresh copy per call of one made once per
    process: light ResNet-50's random weights take 0.4 s CPU to draw and five test files ask
    for them."""
    if name in _BIG:  # 240-550 MB each, slow tier only, once per test: not kept
        from anychip.zoo import light_model

        return light_model(name, seed=seed)
    model = onnx.ModelProto()
    model.CopyFrom(_light(name, seed))
    return model


_BIG = {"bvlc_alexnet", "vgg19", "zfnet512"}


@functools.lru_cache(maxsize=4)  # the largest asked for in the default tier: ResNet-50, 97 MB
def _light(name: str, seed: int) -> onnx.ModelProto:
    from anychip.zoo import light_model

    return light_model(name, seed=seed)


def transformer_layer(
    seq: int | str = 64,
    hidden: int = 256,
    heads: int = 4,
    ffn: int = 1024,
    seed: int = 0,
    causal: bool = False,
    ln_mean: bool = False,
) -> onnx.ModelProto:
    """One BERT-style encoder layer (opset 17): attention, LayerNorm, GELU feed-forward. A
        string ``seq`` makes the sequence length a symbolic dimension of that name (the Reshapes
        then copy it with 0). ``causal`` adds a GPT-style mask (a constant, -1e9 above the
    diagonal, added to the scores before Softmax; needs an int ``seq``). ``ln_mean``: the two
    LayerNormalizations also output their Mean, which the XPU's kernel does not give (a model
    with nodes that fall back from the XPU)."""
    rng = np.random.default_rng(seed)
    head = hidden // heads
    dim = 0 if isinstance(seq, str) else seq  # Reshape: 0 copies the input's dimension

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name)

    inits = [
        w("wq", hidden, hidden),
        w("wk", hidden, hidden),
        w("wv", hidden, hidden),
        w("wo", hidden, hidden),
        w("w1", hidden, ffn),
        w("w2", ffn, hidden),
        numpy_helper.from_array(np.ones(hidden, np.float32), "g1"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "b1"),
        numpy_helper.from_array(np.ones(hidden, np.float32), "g2"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "b2"),
        numpy_helper.from_array(np.array([1, dim, heads, head], np.int64), "split_shape"),
        numpy_helper.from_array(np.array([1, dim, hidden], np.int64), "merge_shape"),
        numpy_helper.from_array(np.array(np.sqrt(head), np.float32), "scale"),
        numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "wq"], ["q"], name="attn/q"),
        n("MatMul", ["x", "wk"], ["k"], name="attn/k"),
        n("MatMul", ["x", "wv"], ["v"], name="attn/v"),
        n("Reshape", ["q", "split_shape"], ["q4"], name="attn/q_split"),
        n("Reshape", ["k", "split_shape"], ["k4"], name="attn/k_split"),
        n("Reshape", ["v", "split_shape"], ["v4"], name="attn/v_split"),
        n("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3], name="attn/q_t"),
        n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1], name="attn/k_t"),
        n("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3], name="attn/v_t"),
        n("MatMul", ["qt", "kt"], ["s"], name="attn/scores"),
        n("Div", ["s", "scale"], ["ss"], name="attn/scale"),
        n("Softmax", ["ssm" if causal else "ss"], ["p"], axis=-1, name="attn/softmax"),
        n("MatMul", ["p", "vt"], ["ctx"], name="attn/context"),
        n("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3], name="attn/merge_t"),
        n("Reshape", ["ctxt", "merge_shape"], ["merged"], name="attn/merge"),
        n("MatMul", ["merged", "wo"], ["o"], name="attn/out"),
        n("Add", ["o", "x"], ["r1"], name="attn/residual"),
        n(
            "LayerNormalization",
            ["r1", "g1", "b1"],
            ["h"] + ["ln1_mean"] * ln_mean,
            axis=-1,
            name="ln1",
        ),
        n("MatMul", ["h", "w1"], ["f1"], name="ffn/up"),
        n("Div", ["f1", "sqrt2"], ["f1s"], name="ffn/gelu_div"),
        n("Erf", ["f1s"], ["ferf"], name="ffn/gelu_erf"),
        n("Add", ["ferf", "one"], ["fe1"], name="ffn/gelu_add"),
        n("Mul", ["f1", "fe1"], ["fm"], name="ffn/gelu_mul"),
        n("Mul", ["fm", "half"], ["fg"], name="ffn/gelu_half"),
        n("MatMul", ["fg", "w2"], ["f2"], name="ffn/down"),
        n("Add", ["f2", "h"], ["r2"], name="ffn/residual"),
        n(
            "LayerNormalization",
            ["r2", "g2", "b2"],
            ["y"] + ["ln2_mean"] * ln_mean,
            axis=-1,
            name="ln2",
        ),
    ]
    if causal:
        mask = np.triu(np.full((seq, seq), -1e9, np.float32), k=1)[None, None]
        inits.append(numpy_helper.from_array(mask, "causal_mask"))
        at = next(i for i, node in enumerate(nodes) if node.name == "attn/softmax")
        nodes.insert(at, n("Add", ["ss", "causal_mask"], ["ssm"], name="attn/causal_mask"))
    g = helper.make_graph(
        nodes,
        "transformer_layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
