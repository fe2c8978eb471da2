"""The CPU model set of issue 14's table, and the table itself: anychip's CPU beside
onnxruntime (all graph optimizations) and OpenVINO CPU, interleaved, medians, ratios, max diff.

No downloads and no torch: onnx's nine light CNNs with seeded random weights (``zoo.py``), the
two tiny Hugging Face exports in ``tests/data`` (BERT, GPT-2), the held-out graphs of
``bench/models.py`` (MLP, LSTM, a BERT-like encoder layer and a GPT-2-like causal one) and four
CNNs built here with ``onnx.helper`` and seeded numpy weights: MobileNet-like (depthwise
separable, BatchNorm, Relu6), ResNet-like (ResNet-18 basic blocks), ShuffleNet-like (v2 units:
channel split, depthwise, channel shuffle) and DenseNet-like (dense blocks of concatenations).

    python bench/cpu_models.py [--threads 2] [--runs 10] [--against onnxruntime openvino]
                               [--models a,b] [--json FILE] [--cpu-time]

The same runs as ``anychip bench NAME...`` (``cli/bench.py``); any name below works there.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

__all__ = [
    "EXTRA",
    "MODELS",
    "build",
    "conv_transformer",
    "densenet_like",
    "mobilenet_like",
    "resnet_like",
    "shufflenet_like",
]

Feeds = dict[str, np.ndarray]


class _Net:
    """A CNN under construction: nodes, seeded He-normal weights, unique names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def _name(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"

    def const(self, array: np.ndarray, kind: str = "c") -> str:
        name = self._name(kind)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op: str, ins: list[str], **attrs: object) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, ins, [out], name=out + "_node", **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
        fan_in = cin // group * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)
        p = k // 2
        return self.op(
            "Conv",
            [x, self.const(w.astype(np.float32), "w")],
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[p, p, p, p],
            group=group,
        )

    def bn(self, x: str, c: int) -> str:
        r = self.rng
        ins = [
            r.uniform(0.3, 0.7, c),  # scale
            r.standard_normal(c) * 0.05,  # bias
            r.standard_normal(c) * 0.05,  # mean
            r.uniform(0.5, 1.5, c),  # variance
        ]
        names = [self.const(a.astype(np.float32), "bn") for a in ins]
        return self.op("BatchNormalization", [x, *names], epsilon=1e-5)

    def relu(self, x: str) -> str:
        return self.op("Relu", [x])

    def relu6(self, x: str) -> str:
        lo = self.const(np.array(0.0, np.float32))
        hi = self.const(np.array(6.0, np.float32))
        return self.op("Clip", [x, lo, hi])

    def head(self, x: str, c: int, classes: int = 1000) -> str:
        g = self.op("Flatten", [self.op("GlobalAveragePool", [x])])
        w = self.rng.standard_normal((c, classes)) * np.sqrt(1.0 / c)
        b = self.rng.standard_normal(classes) * 0.01
        # Logits, not probabilities: a max |diff| over ~1e-3 probabilities would tell nothing.
        return self.op(
            "Gemm", [g, self.const(w.astype(np.float32)), self.const(b.astype(np.float32))]
        )

    def model(self, name: str, y: str, shape: tuple[int, ...]) -> onnx.ModelProto:
        # The last node writes the graph output "y".
        self.nodes[-1].output[0] = "y"
        del y
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        g = helper.make_graph(self.nodes, name, [x], [out], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        return onnx.shape_inference.infer_shapes(m)


def mobilenet_like(size: int = 224, seed: int = 0) -> onnx.ModelProto:
    """MobileNet v1 (width 1.0): depthwise 3x3 + pointwise 1x1 blocks, BatchNorm, Relu6."""
    n = _Net(seed)
    x, c = _mobilenet_trunk(n)
    return n.model("mobilenet_like", n.head(x, c), (1, 3, size, size))


def _mobilenet_trunk(n: _Net) -> tuple[str, int]:
    """MobileNet v1's convolutions on input "x": the output and its channels."""
    x = n.relu6(n.bn(n.conv("x", 3, 32, 3, 2), 32))
    c = 32
    plan = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)]
    plan += [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    for cout, stride in plan:
        x = n.relu6(n.bn(n.conv(x, c, c, 3, stride, group=c), c))
        x = n.relu6(n.bn(n.conv(x, c, cout, 1), cout))
        c = cout
    return x, c


def resnet_like(size: int = 224, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18: a 7x7 stem, four stages of two basic blocks, residual Adds."""
    n = _Net(seed)
    x = n.relu(n.bn(n.conv("x", 3, 64, 7, 2), 64))
    x = n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = n.relu(n.bn(n.conv(x, c, cout, 3, stride), cout))
            y = n.bn(n.conv(y, cout, cout, 3), cout)
            skip = x if stride == 1 and c == cout else n.bn(n.conv(x, c, cout, 1, stride), cout)
            x = n.relu(n.op("Add", [y, skip]))
            c = cout
    return n.model("resnet_like", n.head(x, c), (1, 3, size, size))


def _shuffle(n: _Net, x: str, c: int, hw: int) -> str:
    """Channel shuffle of two groups: Reshape, Transpose, Reshape."""
    s5 = n.const(np.array([1, 2, c // 2, hw, hw], np.int64))
    s4 = n.const(np.array([1, c, hw, hw], np.int64))
    t = n.op("Transpose", [n.op("Reshape", [x, s5])], perm=[0, 2, 1, 3, 4])
    return n.op("Reshape", [t, s4])


def shufflenet_like(size: int = 224, seed: int = 0) -> onnx.ModelProto:
    """ShuffleNet v2 (1.0x, fewer units): channel split, a 1x1-dw3x3-1x1 branch, concat and
    channel shuffle; downsampling units run both branches on the whole input."""
    n = _Net(seed)
    x = n.relu(n.bn(n.conv("x", 3, 24, 3, 2), 24))
    x = n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c, hw = 24, size // 4
    for cout, units in ((116, 2), (232, 3), (464, 2)):
        half = cout // 2
        hw //= 2
        a = n.bn(n.conv(x, c, c, 3, 2, group=c), c)
        a = n.relu(n.bn(n.conv(a, c, half, 1), half))
        b = n.relu(n.bn(n.conv(x, c, half, 1), half))
        b = n.bn(n.conv(b, half, half, 3, 2, group=half), half)
        b = n.relu(n.bn(n.conv(b, half, half, 1), half))
        x = _shuffle(n, n.op("Concat", [a, b], axis=1), cout, hw)
        for _ in range(units - 1):
            split = n.const(np.array([half, half], np.int64))
            left, right = n._name("split_l"), n._name("split_r")
            n.nodes.append(helper.make_node("Split", [x, split], [left, right], axis=1))
            b = n.relu(n.bn(n.conv(right, half, half, 1), half))
            b = n.bn(n.conv(b, half, half, 3, 1, group=half), half)
            b = n.relu(n.bn(n.conv(b, half, half, 1), half))
            x = _shuffle(n, n.op("Concat", [left, b], axis=1), cout, hw)
        c = cout
    x = n.relu(n.bn(n.conv(x, c, 1024, 1), 1024))
    return n.model("shufflenet_like", n.head(x, 1024), (1, 3, size, size))


def densenet_like(size: int = 224, seed: int = 0, growth: int = 32) -> onnx.ModelProto:
    """DenseNet (three dense blocks of 6, 8, 6 layers): BN-Relu-Conv1x1-BN-Relu-Conv3x3 layers
    concatenated onto their input, transitions halving channels and resolution."""
    n = _Net(seed)
    x = n.relu(n.bn(n.conv("x", 3, 64, 7, 2), 64))
    x = n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = 64
    for i, layers in enumerate((6, 8, 6)):
        for _ in range(layers):
            y = n.conv(n.relu(n.bn(x, c)), c, 4 * growth, 1)
            y = n.conv(n.relu(n.bn(y, 4 * growth)), 4 * growth, growth, 3)
            x = n.op("Concat", [x, y], axis=1)
            c += growth
        if i < 2:
            x = n.conv(n.relu(n.bn(x, c)), c, c // 2, 1)
            c //= 2
            x = n.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    return n.model("densenet_like", n.head(n.relu(n.bn(x, c)), c), (1, 3, size, size))


def _encoder_layer(n: _Net, x: str, seq: int, hidden: int, heads: int, ffn: int) -> str:
    """One BERT-style encoder layer on ``x`` ([1, seq, hidden]): attention, LayerNorm, GELU."""

    def w(*shape: int) -> str:
        return n.const((n.rng.standard_normal(shape) * 0.05).astype(np.float32), "w")

    def c(value: object, dtype: type = np.float32) -> str:
        return n.const(np.array(value, dtype))

    head = hidden // heads
    split, merge = c([1, seq, heads, head], np.int64), c([1, seq, hidden], np.int64)
    q, k, v = (n.op("Reshape", [n.op("MatMul", [x, w(hidden, hidden)]), split]) for _ in "qkv")
    qt = n.op("Transpose", [q], perm=[0, 2, 1, 3])
    kt = n.op("Transpose", [k], perm=[0, 2, 3, 1])
    vt = n.op("Transpose", [v], perm=[0, 2, 1, 3])
    s = n.op("Div", [n.op("MatMul", [qt, kt]), c(np.sqrt(head))])
    ctx = n.op("MatMul", [n.op("Softmax", [s], axis=-1), vt])
    merged = n.op("Reshape", [n.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge])
    r1 = n.op("Add", [n.op("MatMul", [merged, w(hidden, hidden)]), x])
    ones, zeros = c(np.ones(hidden)), c(np.zeros(hidden))
    h = n.op("LayerNormalization", [r1, ones, zeros], axis=-1)
    f1 = n.op("MatMul", [h, w(hidden, ffn)])
    erf = n.op("Erf", [n.op("Div", [f1, c(np.sqrt(2.0))])])
    gelu = n.op("Mul", [n.op("Mul", [f1, n.op("Add", [erf, c(1.0)])]), c(0.5)])
    r2 = n.op("Add", [n.op("MatMul", [gelu, w(ffn, hidden)]), h])
    return n.op("LayerNormalization", [r2, ones, zeros], axis=-1)


def conv_transformer(size: int = 224, seed: int = 0, layers: int = 4) -> onnx.ModelProto:
    """A hybrid (as ViT-hybrid, CoAtNet): ``mobilenet_like``'s convolutions to a 7 x 7 map, a
    1x1 projection to 256 channels, its 49 positions as tokens through ``layers`` encoder
    layers (d 256, 4 heads), mean-pooled to 1000 logits. Its halves run fastest on different
    engines on some machines (the convolutions on ``cpu``, the small matrix products on
    onnxruntime), so a placement may split it (issue 42)."""
    n = _Net(seed)
    x, c = _mobilenet_trunk(n)
    side = size // 32
    tokens = n.op("Reshape", [n.conv(x, c, 256, 1), n.const(np.array([1, 256, side * side]))])
    t = n.op("Transpose", [tokens], perm=[0, 2, 1])
    for _ in range(layers):
        t = _encoder_layer(n, t, side * side, 256, 4, 1024)
    pooled = n.op("ReduceMean", [t], axes=[1], keepdims=0)  # opset 17: axes an attribute
    w = (n.rng.standard_normal((256, 1000)) * np.sqrt(1.0 / 256)).astype(np.float32)
    b = (n.rng.standard_normal(1000) * 0.01).astype(np.float32)
    n.op("Gemm", [pooled, n.const(w), n.const(b)])
    return n.model("conv_transformer", "", (1, 3, size, size))


def _image(model: onnx.ModelProto, seed: int = 0) -> Feeds:
    """A seeded standard-normal input of the model's (static) input shape."""
    (inp,) = [
        i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}
    ]
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    return {inp.name: rng.standard_normal(shape).astype(np.float32)}


def _light(name: str) -> Callable[[], tuple[onnx.ModelProto, Feeds]]:
    def make() -> tuple[onnx.ModelProto, Feeds]:
        from anychip.zoo import light_model

        m = light_model(name)
        return m, _image(m)  # type: ignore[arg-type]

    return make


def _held_out(name: str) -> Callable[[], tuple[onnx.ModelProto, Feeds]]:
    def make() -> tuple[onnx.ModelProto, Feeds]:
        from bench.models import HELD_OUT

        factory, _ = HELD_OUT[name]
        m = onnx.load_from_string(factory())
        return m, _image(m)

    return make


def _hf(name: str) -> Callable[[], tuple[onnx.ModelProto, Feeds]]:
    def make() -> tuple[onnx.ModelProto, Feeds]:
        m = onnx.load(os.path.join(_ROOT, "tests", "data", f"{name}.onnx"))
        rng = np.random.default_rng(0)
        feeds = {"input_ids": rng.integers(0, 128, (1, 128)).astype(np.int64)}
        if any(i.name == "attention_mask" for i in m.graph.input):
            feeds["attention_mask"] = np.ones((1, 128), np.int64)
        return m, feeds

    return make


def _built(fn: Callable[[], onnx.ModelProto]) -> Callable[[], tuple[onnx.ModelProto, Feeds]]:
    def make() -> tuple[onnx.ModelProto, Feeds]:
        m = fn()
        return m, _image(m)

    return make


_LIGHT = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50")
_LIGHT += ("shufflenet", "squeezenet", "vgg19", "zfnet512")

#: name -> () -> (model, feeds); the order of the table.
MODELS: dict[str, Callable[[], tuple[onnx.ModelProto, Feeds]]] = {
    **{name: _light(name) for name in _LIGHT},
    "bert_like": _held_out("bert_like"),
    "gpt2_like": _held_out("gpt_like"),
    "hf_bert_tiny": _hf("hf_bert_tiny"),
    "hf_gpt2_tiny": _hf("hf_gpt2_tiny"),
    "lstm": _held_out("lstm"),
    "mlp": _held_out("mlp"),
    "mobilenet_like": _built(mobilenet_like),
    "resnet_like": _built(resnet_like),
    "shufflenet_like": _built(shufflenet_like),
    "densenet_like": _built(densenet_like),
}
#: Built by name (``--models conv_transformer``), not in the default table (issue 43's set).
EXTRA: dict[str, Callable[[], tuple[onnx.ModelProto, Feeds]]] = {
    "conv_transformer": _built(conv_transformer),
}


def build(name: str) -> tuple[onnx.ModelProto, Feeds]:
    """The model ``name`` of ``MODELS`` or ``EXTRA`` and its seeded inputs."""
    return (MODELS | EXTRA)[name]()


def main(argv: list[str] | None = None) -> None:
    from anychip.cli.bench import PEERS, WARMUP, bench_models, format_table
    from anychip.viz.terminal import progress_bars

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of names")
    ap.add_argument("--against", nargs="+", choices=PEERS, default=list(PEERS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--json", default=None, metavar="FILE")
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time, not wall clock")
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS and m not in EXTRA]
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {', '.join([*MODELS, *EXTRA])}")
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if not sys.stderr.isatty() else None
    with progress_bars():
        result = bench_models(
            names,
            args.against,
            ["cpu"],
            args.threads,
            args.runs,
            args.warmup,
            log=log,
            cpu_time=args.cpu_time,
        )
    print(format_table(result))
    if args.json:
        import json

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
