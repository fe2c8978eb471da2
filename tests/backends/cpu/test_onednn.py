"""The oneDNN kernels of the CPU backend (backends/cpu/onednn) against onnxruntime.

Each case is one node with seeded random inputs and weights, run by ``anychip.load`` on the CPU
and by onnxruntime; the test also checks that oneDNN ran it (a primitive of that kind was
made) or, for the attribute sets oneDNN cannot do, that the numpy kernel gave the answer.
``onednn-cpu-gomp`` is in the ``test`` extra: a machine without it fails here, with the reason.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn._prim import REORDERS
from anychip.backends.cpu.onednn.kernels import RUNS

F = TensorProto.FLOAT


@pytest.fixture(autouse=True)
def _need_onednn() -> None:
    assert _lib.available(), _lib.unavailable_reason()


def _model(
    nodes: list[Any],
    inputs: dict[str, np.ndarray],
    weights: dict[str, np.ndarray],
    outputs: Sequence[str],
    opset: int = 17,
    ms: bool = False,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(k, F, list(v.shape)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, F, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    ops = [helper.make_opsetid("", opset)]
    if ms:
        ops.append(helper.make_opsetid("com.microsoft", 1))
    return helper.make_model(graph, opset_imports=ops, ir_version=8)


def _run_both(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[list, list]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    want = ref.run(None, feeds)
    got = anychip.load(model, devices=["cpu"]).run(None, feeds)
    got = list(got.values()) if isinstance(got, dict) else list(got)
    return [np.asarray(g) for g in got], want


def _close(got: list, want: list, tol: float = 1e-4) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale)


def _served(op: str, path: str) -> int:
    """How many calls of ``op``'s kernel took ``path`` ("onednn" or "numpy") so far."""
    return RUNS[op, path]


class _Counts:
    """The kernels' path counters over a block: ``delta(op, path)``."""

    def __enter__(self) -> _Counts:
        self.before = dict(RUNS)
        return self

    def __exit__(self, *exc: object) -> None:
        self.after = dict(RUNS)

    def delta(self, op: str, path: str) -> int:
        return self.after.get((op, path), 0) - self.before.get((op, path), 0)


def _rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


CONV_CASES = [
    # x shape, w shape, attributes
    ((1, 8, 12, 12), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 8, 13, 11), (16, 8, 3, 3), {"strides": [2, 2], "pads": [1, 0, 2, 1]}),
    ((1, 6, 15, 15), (6, 3, 3, 3), {"group": 2, "dilations": [2, 2]}),
    ((1, 16, 14, 14), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 8, 10, 10), (4, 8, 5, 5), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 8, 9, 10), (4, 8, 4, 4), {"auto_pad": "SAME_LOWER"}),
    ((1, 8, 9, 9), (4, 8, 3, 3), {"auto_pad": "VALID"}),
    ((1, 32, 7, 7), (64, 32, 1, 1), {}),
    ((2, 32, 8, 8), (16, 32, 1, 1), {"strides": [2, 2]}),
    ((1, 3, 20, 20), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((2, 4, 30), (6, 4, 5), {"pads": [2, 2], "dilations": [2]}),
    ((1, 4, 6, 7, 8), (5, 4, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    ((1, 4, 5, 6, 7), (6, 2, 3, 3, 3), {"group": 2, "strides": [1, 2, 1]}),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv_matches_onnxruntime(case: int, bias: bool) -> None:
    xs, ws, attrs = CONV_CASES[case]
    rng = np.random.default_rng(case)
    x, w = _rand(rng, *xs), _rand(rng, *ws, scale=0.3)
    weights = {"W": w}
    ins = ["X", "W"]
    if bias:
        weights["B"] = _rand(rng, ws[0])
        ins.append("B")
    node = helper.make_node("Conv", ins, ["Y"], **attrs)
    with _Counts() as n:
        got, want = _run_both(_model([node], {"X": x}, weights, ["Y"]), {"X": x})
    _close(got, want)
    assert n.delta("Conv", "onednn") == 1 and n.delta("Conv", "numpy") == 0


def test_conv_chain_matches_onnxruntime_in_planned_memory() -> None:
    """Conv -> Relu -> Conv -> MaxPool -> Conv -> GlobalAveragePool: every planned output is
    written in place (planned memory is C-contiguous, so these stay NCHW) and the result is
    onnxruntime's."""
    rng = np.random.default_rng(7)
    x = _rand(rng, 1, 8, 16, 16)
    weights = {
        "W1": _rand(rng, 16, 8, 3, 3, scale=0.3),
        "W2": _rand(rng, 16, 16, 3, 3, scale=0.2),
        "W3": _rand(rng, 8, 16, 1, 1, scale=0.3),
        "B1": _rand(rng, 16),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["a0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a0"], ["a"]),
        helper.make_node("Conv", ["a", "W2"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["b"], ["c"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["c", "W3"], ["d"]),
        helper.make_node("GlobalAveragePool", ["d"], ["Y"]),
    ]
    with _Counts() as n:
        got, want = _run_both(_model(nodes, {"X": x}, weights, ["Y"]), {"X": x})
    _close(got, want)
    # the fusion pass makes Conv+Relu one FusedConv: both run through oneDNN
    convs = n.delta("Conv", "onednn") + n.delta("FusedConv", "onednn")
    assert convs == 3 and n.delta("GlobalAveragePool", "onednn") == 1
    # Conv's planned memory (fused, Conv+Relu would be a FusedConv kept channels-last)
    unfused = {"cpu": {"fusion": False}}
    session = anychip.load(
        _model(nodes, {"X": x}, weights, ["Y"]), devices=["cpu"], device_options=unfused
    )
    session.run(None, {"X": x})
    assert session.memory()["cpu"].declined == 0


def test_fused_conv_chain_keeps_channels_last_between_onednn_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FusedConv(Relu) -> FusedConv(+Z residual, Relu) -> FusedConv -> GlobalAveragePool (what
    the fusion pass writes): the middle tensors stay channels-last, read in place by the next
    oneDNN node (the plan's NCHW buffers declined), so the only reorder of a warm run is X's
    into the first; onnxruntime's result."""
    monkeypatch.setenv("ANYCHIP_REPLAY", "0")  # the kernels' reorders counted: not a replay
    rng = np.random.default_rng(8)
    x = _rand(rng, 1, 8, 16, 16)
    weights = {
        "W1": _rand(rng, 16, 8, 3, 3, scale=0.3),
        "W2": _rand(rng, 16, 16, 3, 3, scale=0.2),
        "W3": _rand(rng, 8, 16, 1, 1, scale=0.3),
        "B1": _rand(rng, 16),
    }
    ms = "com.microsoft"
    nodes = [
        helper.make_node(
            "FusedConv", ["X", "W1", "B1"], ["a"], domain=ms, pads=[1, 1, 1, 1], activation="Relu"
        ),
        helper.make_node(
            "FusedConv",
            ["a", "W2", "", "a"],
            ["b"],
            domain=ms,
            pads=[1, 1, 1, 1],
            activation="Relu",
        ),  # fmt: skip
        helper.make_node("FusedConv", ["b", "W3"], ["d"], domain=ms),
        helper.make_node("GlobalAveragePool", ["d"], ["Y"]),
    ]
    model = _model(nodes, {"X": x}, weights, ["Y"], ms=True)
    with _Counts() as n:
        got, want = _run_both(model, {"X": x})
    _close(got, want)
    assert n.delta("FusedConv", "onednn") == 3 and n.delta("GlobalAveragePool", "onednn") == 1
    session = anychip.load(model, devices=["cpu"])
    for _ in range(2):
        session.run(None, {"X": x})
    before = dict(REORDERS)
    session.run(None, {"X": x})
    moved = {k: v - before.get(k, 0) for k, v in REORDERS.items() if v != before.get(k, 0)}
    assert moved == {"src": 1}, moved  # only X, into the first convolution


FUSED = [
    ("Relu", []),
    ("LeakyRelu", [0.2]),
    ("Clip", [-0.5, 0.7]),
    ("Sigmoid", []),
    ("Tanh", []),
    ("HardSigmoid", [0.3, 0.4]),
    (None, []),
]


@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize("act", range(len(FUSED)))
def test_fused_conv_matches_onnxruntime(act: int, with_z: bool) -> None:
    name, params = FUSED[act]
    rng = np.random.default_rng(100 + act)
    x, z = _rand(rng, 1, 8, 10, 10), _rand(rng, 1, 12, 5, 5)
    weights = {"W": _rand(rng, 12, 8, 3, 3, scale=0.3), "B": _rand(rng, 12)}
    attrs: dict[str, Any] = {"pads": [1, 1, 1, 1], "strides": [2, 2]}
    if name:
        attrs["activation"] = name
        if params:
            attrs["activation_params"] = params
    ins = ["X", "W", "B"] + (["Z"] if with_z else [])
    feeds = {"X": x, **({"Z": z} if with_z else {})}
    node = helper.make_node("FusedConv", ins, ["Y"], domain="com.microsoft", **attrs)
    with _Counts() as n:
        got, want = _run_both(_model([node], feeds, weights, ["Y"], ms=True), feeds)
    _close(got, want)
    assert n.delta("FusedConv", "onednn") == 1


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize("act", [0, 2, 6])  # Relu, Clip, none
def test_pointwise_conv_on_nchw_runs_as_matmul(
    act: int, with_z: bool, group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1x1 FusedConv whose output a numpy node (Concat) reads writes NCHW through oneDNN's
    matmul (conv1x1.py: bias and Z as post-ops; with groups the bias and a Relu in one C pass, any
    other activation on the convolution primitive), batch 2, equal to onnxruntime's."""
    from anychip.backends.cpu.onednn import conv1x1

    served: list[bool] = []
    real = conv1x1.run

    def spy(*args: Any) -> Any:
        y = real(*args)
        served.append(y is not None)
        return y

    monkeypatch.setattr(conv1x1, "run", spy)
    name, params = FUSED[act]
    rng = np.random.default_rng(140 + act)
    x, z = _rand(rng, 2, 24, 9, 7), _rand(rng, 2, 40, 9, 7)
    weights = {"W": _rand(rng, 40, 24 // group, 1, 1, scale=0.3), "B": _rand(rng, 40)}
    attrs: dict[str, Any] = {"activation": name} if name else {}
    if params:
        attrs["activation_params"] = params
    ins = ["X", "W", "B"] + (["Z"] if with_z else [])
    feeds = {"X": x, **({"Z": z} if with_z else {})}
    nodes = [
        helper.make_node("FusedConv", ins, ["C"], domain="com.microsoft", group=group, **attrs),
        helper.make_node("Concat", ["C", "X"], ["Y"], axis=1),
    ]
    with _Counts() as n:
        got, want = _run_both(_model(nodes, feeds, weights, ["Y"], ms=True), feeds)
    _close(got, want)
    assert n.delta("FusedConv", "onednn") == 1
    assert served == [group == 1 or name != "Clip"]


POOL_CASES = [
    ("MaxPool", (1, 8, 13, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (2, 4, 11, 12), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", (1, 4, 12, 12), {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ("MaxPool", (1, 4, 9, 9), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}),
    ("MaxPool", (1, 3, 20), {"kernel_shape": [4], "strides": [3]}),
    ("AveragePool", (1, 8, 13, 13), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    (
        "AveragePool",
        (1, 8, 13, 13),
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    ),
    ("AveragePool", (1, 4, 11, 11), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    (
        "AveragePool",
        (1, 4, 12, 12),
        {
            "kernel_shape": [3, 3],
            "strides": [2, 2],
            "ceil_mode": 1,
            "count_include_pad": 1,
            "pads": [1, 1, 1, 1],
        },
    ),
    ("AveragePool", (1, 4, 7, 7, 7), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
    ("GlobalAveragePool", (2, 16, 7, 7), {}),
    ("GlobalMaxPool", (2, 16, 5, 6), {}),
]


@pytest.mark.parametrize("case", range(len(POOL_CASES)))
def test_pooling_matches_onnxruntime(case: int) -> None:
    op, xs, attrs = POOL_CASES[case]
    x = _rand(np.random.default_rng(200 + case), *xs)
    node = helper.make_node(op, ["X"], ["Y"], **attrs)
    with _Counts() as n:
        got, want = _run_both(_model([node], {"X": x}, {}, ["Y"], opset=19), {"X": x})
    _close(got, want, 1e-5)
    # ceil_mode positions that count_include_pad would count: the numpy kernel's case
    fallback = attrs.get("count_include_pad") and attrs.get("ceil_mode")
    assert n.delta(op, "numpy" if fallback else "onednn") == 1


def test_maxpool_with_indices_runs_the_numpy_kernel() -> None:
    x = _rand(np.random.default_rng(5), 1, 4, 8, 8)
    node = helper.make_node("MaxPool", ["X"], ["Y", "I"], kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", F, list(x.shape))],
        [
            helper.make_tensor_value_info("Y", F, None),
            helper.make_tensor_value_info("I", TensorProto.INT64, None),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with _Counts() as n:
        got, want = _run_both(model, {"X": x})
    assert n.delta("MaxPool", "numpy") == 1
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0])


def _rnn_model(op: str, seq: int, batch: int, inp: int, hidden: int, attrs: dict, extras: set):
    rng = np.random.default_rng(zlib.crc32(repr((op, attrs, sorted(extras))).encode()))
    nd = 2 if attrs.get("direction") == "bidirectional" else 1
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    layout = attrs.get("layout", 0)
    xs = (batch, seq, inp) if layout else (seq, batch, inp)
    x = _rand(rng, *xs)
    weights = {
        "W": _rand(rng, nd, gates * hidden, inp, scale=0.4),
        "R": _rand(rng, nd, gates * hidden, hidden, scale=0.4),
    }
    ins = ["X", "W", "R", "", "", ""]
    if "B" in extras:
        weights["B"] = _rand(rng, nd, 2 * gates * hidden, scale=0.5)
        ins[3] = "B"
    state = (batch, nd, hidden) if layout else (nd, batch, hidden)
    feeds = {"X": x}
    if "h" in extras:
        feeds["H0"] = _rand(rng, *state)
        ins[5] = "H0"
    if op == "LSTM":
        ins.append("")
        if "c" in extras:
            feeds["C0"] = _rand(rng, *state)
            ins[6] = "C0"
        if "P" in extras:
            weights["P"] = _rand(rng, nd, 3 * hidden, scale=0.5)
            ins.append("P")
    if "lens" in extras:
        weights["L"] = np.full(batch, seq, np.int32)
        ins[4] = "L"
    while ins and ins[-1] == "":
        ins.pop()
    outs = ["Y", "Yh"] + (["Yc"] if op == "LSTM" else [])
    node = helper.make_node(op, ins, outs, hidden_size=hidden, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(k, F, list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, F, None) for o in outs],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    return model, feeds


#: op, attributes, optional inputs; the cases oneDNN cannot do are marked "numpy".
RNN_CASES = [
    ("LSTM", {}, {"B"}),
    ("LSTM", {"direction": "reverse"}, {"B", "h", "c"}),
    ("LSTM", {"direction": "bidirectional"}, {"B", "h", "c", "lens"}),
    ("LSTM", {"direction": "bidirectional", "layout": 1}, {"h"}),
    ("LSTM", {}, {"B", "P"}),  # peepholes: the numpy kernel
    ("LSTM", {"clip": 0.5}, {"B"}),  # clip: the numpy kernel
    ("GRU", {}, {"B"}),
    ("GRU", {"linear_before_reset": 1}, {"B", "h"}),
    ("GRU", {"direction": "reverse", "linear_before_reset": 1}, {"B"}),
    ("GRU", {"direction": "bidirectional"}, {"B", "h"}),
    ("GRU", {"direction": "bidirectional", "linear_before_reset": 1, "layout": 1}, {"h", "B"}),
    ("GRU", {"activations": ["Sigmoid", "Relu"]}, {"B"}),  # non-default: the numpy kernel
    ("RNN", {}, {"B"}),
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Relu"]}, {"B", "h"}),
    ("RNN", {"direction": "reverse", "activations": ["Sigmoid"]}, {"h"}),
    ("RNN", {"direction": "bidirectional", "activations": ["Tanh", "Relu"]}, {"B"}),  # numpy
]


@pytest.mark.parametrize("case", range(len(RNN_CASES)))
def test_recurrent_matches_onnxruntime(case: int) -> None:
    """onnxruntime has no layout=1: those cases are checked against the layout=0 model run by
    onnxruntime, with the batch axis moved."""
    op, attrs, extras = RNN_CASES[case]
    model, feeds = _rnn_model(op, 7, 3, 5, 6, attrs, extras)
    acts = attrs.get("activations")
    numpy_case = (
        "P" in extras
        or "clip" in attrs
        or (op != "RNN" and acts)
        or (op == "RNN" and acts is not None and len(set(acts)) > 1)
    )
    if not attrs.get("layout"):
        with _Counts() as n:
            got, want = _run_both(model, feeds)
        _close(got, want)
        assert n.delta(op, "numpy" if numpy_case else "onednn") == 1
        return
    got = anychip.load(model, devices=["cpu"]).run(None, feeds)
    got = list(got.values()) if isinstance(got, dict) else list(got)
    for attr in model.graph.node[0].attribute:
        if attr.name == "layout":
            attr.i = 0
    seq_first = {k: np.ascontiguousarray(v.swapaxes(0, 1)) for k, v in feeds.items()}
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        dims[0].dim_value, dims[1].dim_value = dims[1].dim_value, dims[0].dim_value
    _, want = _run_both(model, seq_first)
    want = [want[0].transpose(2, 0, 1, 3)] + [w.swapaxes(0, 1) for w in want[1:]]
    _close([np.asarray(g) for g in got], want)


MATMUL_CASES = [
    # A shape, B shape, B constant, path
    ((2, 64, 128), (128, 160), True, "onednn"),
    ((160, 100), (100, 140), True, "onednn"),
    ((96, 33), (33, 130), True, "numpy"),  # fewer than MIN_MACS multiply-adds
    ((3, 64), (64, 16), True, "numpy"),  # fewer than MIN_ROWS rows
    ((300, 12), (12, 4), True, "numpy"),  # fewer than MIN_MACS multiply-adds
    ((1, 128, 32), (32, 32), True, "numpy"),  # the tiny exports' 3-D A under MIN_MACS
    ((40, 16), (16, 8), False, "numpy"),  # B is an input, not weights
    ((2, 24, 16), (2, 16, 8), True, "numpy"),  # batched weights
]


@pytest.mark.parametrize("case", range(len(MATMUL_CASES)))
def test_matmul_matches_onnxruntime(case: int) -> None:
    a_shape, b_shape, const, path = MATMUL_CASES[case]
    rng = np.random.default_rng(300 + case)
    a, b = _rand(rng, *a_shape), _rand(rng, *b_shape)
    feeds = {"A": a} if const else {"A": a, "B": b}
    weights = {"B": b} if const else {}
    node = helper.make_node("MatMul", ["A", "B"], ["Y"])
    with _Counts() as n:
        got, want = _run_both(_model([node], feeds, weights, ["Y"]), feeds)
    _close(got, want)
    assert n.delta("MatMul", path) == 1


def test_outputs_that_leave_the_graph_are_c_contiguous() -> None:
    """A Conv output that a oneDNN Conv reads but that is also a graph output is written in C
    order (callers and other devices get plain arrays); both outputs are onnxruntime's."""
    rng = np.random.default_rng(9)
    x = _rand(rng, 1, 8, 6, 6)
    weights = {"W": _rand(rng, 8, 8, 3, 3, scale=0.3)}
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["A"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["A", "W"], ["Y"], pads=[1, 1, 1, 1]),
    ]
    got, want = _run_both(_model(nodes, {"X": x}, weights, ["A", "Y"]), {"X": x})
    _close(got, want)
    session = anychip.load(_model(nodes, {"X": x}, weights, ["A", "Y"]), devices=["cpu"])
    out = session.run(None, {"X": x})
    assert all(a.flags.c_contiguous for a in (out.values() if isinstance(out, dict) else out))


GEMM_CASES = [
    # A shape, B shape, attributes, C shape (None: no C), path
    ((64, 256), (256, 192), {}, (192,), "onednn"),
    ((64, 256), (192, 256), {"transB": 1}, (64, 192), "onednn"),
    ((72, 200), (160, 200), {"transB": 1, "beta": 0.0}, (160,), "onednn"),
    ((64, 256), (256, 192), {"alpha": 0.5}, (192,), "numpy"),  # alpha != 1
    ((256, 64), (256, 192), {"transA": 1}, None, "numpy"),  # A transposed
    ((8, 64), (64, 32), {}, (32,), "numpy"),  # fewer than MIN_ROWS rows
]


@pytest.mark.parametrize("case", range(len(GEMM_CASES)))
def test_gemm_matches_onnxruntime(case: int) -> None:
    """Gemm with a constant B takes oneDNN's matmul (transB packed once); C added after."""
    a_shape, b_shape, attrs, c_shape, path = GEMM_CASES[case]
    rng = np.random.default_rng(400 + case)
    a, b = _rand(rng, *a_shape), _rand(rng, *b_shape)
    weights = {"B": b}
    inputs = ["A", "B"]
    if c_shape is not None:
        weights["C"] = _rand(rng, *c_shape)
        inputs.append("C")
    node = helper.make_node("Gemm", inputs, ["Y"], **attrs)
    with _Counts() as n:
        got, want = _run_both(_model([node], {"A": a}, weights, ["Y"]), {"A": a})
    _close(got, want)
    assert n.delta("Gemm", path) == 1
