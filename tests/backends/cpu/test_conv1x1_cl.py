"""``onednn/conv1x1_cl.py``: a 1x1 convolution from an NCHW source to a channels-last output as
one matmul. In a session (a numpy node's NCHW output into a 1x1 convolution whose reader is a
oneDNN convolution, as in DenseNet's blocks) it runs (``RUNS``), with and without bias and
activation, at batch 1 and 2, one and two threads, equal to onnxruntime on seeded random
inputs; its remembered path serves new inputs; what it does not take goes elsewhere."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import anychip
from anychip.backends.cpu.onednn import _lib, conv1x1_cl
from anychip.cli.bench import _thread_limit
from tests.backends.cpu.test_onednn import _close, _model, _rand

pytestmark = pytest.mark.skipif(_lib.get() is None, reason="oneDNN not loadable here")


def _dense_layer(seed: int, n: int, c: int, hw: int, m: int, bias: bool, act: str | None):
    """x -> Sigmoid (numpy: NCHW) -> Conv 1x1 (+bias, +act) -> Conv 3x3 -> y."""
    rng = np.random.default_rng(seed)
    x = _rand(rng, n, c, hw, hw)
    weights = {"W1": _rand(rng, m, c, 1, 1) * 0.3, "W2": _rand(rng, 8, m, 3, 3) * 0.3}
    ins = ["s", "W1"]
    if bias:
        weights["B1"] = _rand(rng, m)
        ins.append("B1")
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Conv", ins, ["a"])]
    if act:
        nodes.append(helper.make_node(act, ["a"], ["r"]))
    nodes.append(helper.make_node("Conv", ["r" if act else "a", "W2"], ["y"], pads=[1] * 4))
    return _model(nodes, {"x": x}, weights, ["y"]), x


def _onnxruntime(model, x: np.ndarray) -> list:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return ref.run(None, {"x": x})


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "n, c, hw, m, bias, act",
    [
        (1, 24, 14, 40, True, "Relu"),
        (1, 17, 9, 33, False, None),
        (2, 32, 8, 16, True, None),
        (1, 64, 7, 128, False, "Relu"),
    ],
)
def test_equals_onnxruntime_and_runs_here(threads, n, c, hw, m, bias, act):
    model, x = _dense_layer(n + c + m, n, c, hw, m, bias, act)
    with _thread_limit(threads):
        sess = anychip.load(model, devices=["cpu"], device_options={"cpu": {"replay": False}})
        before = conv1x1_cl.RUNS[0]
        rng = np.random.default_rng(7)
        for k in range(3):  # the first call, then the remembered path on new inputs
            feeds = x if k == 0 else _rand(rng, *x.shape)
            got = sess.run(None, {"x": feeds})
            _close([np.asarray(g) for g in got], _onnxruntime(model, feeds), tol=1e-5)
    assert conv1x1_cl.RUNS[0] - before == 3


def test_what_it_does_not_take():
    x = np.zeros((1, 8, 5, 5), np.float32)
    w = np.zeros((4, 8, 1, 1), np.float32)
    plain = ((1, 1), (1, 1), (0, 0), (0, 0))
    assert conv1x1_cl.applies(x, w, None, 1, plain)
    assert not conv1x1_cl.applies(x, w, np.zeros((1, 4, 5, 5), np.float32), 1, plain)  # Z
    assert not conv1x1_cl.applies(x, w[:, :4], None, 2, plain)  # groups
    assert not conv1x1_cl.applies(x, w, None, 1, ((2, 2), (1, 1), (0, 0), (0, 0)))  # stride
    assert not conv1x1_cl.applies(x, w, None, 1, ((1, 1), (1, 1), (1, 1), (1, 1)))  # pads
    assert not conv1x1_cl.applies(x, np.zeros((4, 8, 3, 3), np.float32), None, 1, plain)
    assert not conv1x1_cl.applies(x.transpose(0, 1, 3, 2), w, None, 1, plain)  # strided
    assert not conv1x1_cl.applies(x.astype(np.float64), w, None, 1, plain)


@pytest.mark.parametrize("bias", [True, False])
def test_two_threads_split_the_output_channels(monkeypatch, bias):
    """Left on one OpenMP thread with two given, the product runs as blocks of output
    channels on the pool (``_Parts``: a strided destination each), bias sliced per block;
    equal to onnxruntime on new inputs through the remembered path."""
    from anychip.backends.cpu.native import pool

    monkeypatch.setattr(conv1x1_cl, "SPLIT_WORK", 0)
    monkeypatch.setattr(pool, "try_parallel", lambda: True)
    model, x = _dense_layer(5, 1, 24, 10, 40, bias, "Relu")
    with _thread_limit(2):
        sess = anychip.load(model, devices=["cpu"], device_options={"cpu": {"replay": False}})
        rng = np.random.default_rng(9)
        for k in range(3):
            feeds = x if k == 0 else _rand(rng, *x.shape)
            got = sess.run(None, {"x": feeds})
            _close([np.asarray(g) for g in got], _onnxruntime(model, feeds), tol=1e-5)
    fasts = [
        n.meta["onednn_conv"][1].get("fast")
        for p in sess.partitions
        for n in p.graph.nodes
        if "onednn_conv" in n.meta
    ]
    assert any(isinstance(getattr(f, "plan", None), conv1x1_cl._Parts) for f in fasts)


def test_a_whole_product_and_a_part_of_another_keep_their_own_weight_layouts(monkeypatch):
    """Two 1x1 nodes on one NCHW source: one whole (40 outputs, brgemm's packed weights), one
    split into two blocks of 40 (gemm:jit's layout). Their weights' reorders were cached by
    one key, so one node's weights were written in the other's layout into a buffer of the
    wrong size (a heap corruption that crashed the bench); each now has its own."""
    from anychip.backends.cpu.native import pool

    rng = np.random.default_rng(31)
    c, hw = 24, 12  # 40 outputs: brgemm pads them, gemm:jit does not
    x = _rand(rng, 1, c, hw, hw)
    weights = {
        "WA": _rand(rng, 40, c, 1, 1) * 0.3,
        "WB": _rand(rng, 80, c, 1, 1) * 0.3,
        "W3": _rand(rng, 4, 40, 3, 3) * 0.3,
        "W4": _rand(rng, 4, 80, 3, 3) * 0.3,
    }
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Conv", ["s", "WA"], ["a"]),
        helper.make_node("Conv", ["s", "WB"], ["b"]),
        helper.make_node("Conv", ["a", "W3"], ["ya"], pads=[1] * 4),
        helper.make_node("Conv", ["b", "W4"], ["yb"], pads=[1] * 4),
    ]
    model = _model(nodes, {"x": x}, weights, ["ya", "yb"])
    work_a = c * 40 * hw * hw
    monkeypatch.setattr(conv1x1_cl, "SPLIT_WORK", work_a + 1)  # the 80-output node splits
    monkeypatch.setattr(conv1x1_cl, "MIN_CHANNELS", 8)
    monkeypatch.setattr(pool, "try_parallel", lambda: True)
    with _thread_limit(2):
        sess = anychip.load(model, devices=["cpu"], device_options={"cpu": {"replay": False}})
        for _ in range(2):
            got = sess.run(None, {"x": x})
            _close([np.asarray(g) for g in got], _onnxruntime(model, x), tol=1e-5)
