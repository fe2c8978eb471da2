"""Layouts carried across numpy-side ops between oneDNN kernels: a channel Concat whose
readers are all oneDNN kernels writes channels-last (``onednn/kernels.py``), so neither its
producers nor its reader reorder; results equal onnxruntime's and the unfused run's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn._prim import REORDERS

F = TensorProto.FLOAT


@pytest.fixture(autouse=True)
def _need_onednn() -> None:
    assert _lib.available(), _lib.unavailable_reason()


@pytest.fixture(autouse=True)
def _kernels_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests count the kernels' reorders run by run: the path through the kernels, not
    a replay of their recorded calls (``backends/cpu/replay/record.py``, tested in tests/core)."""
    monkeypatch.setenv("ANYCHIP_REPLAY", "0")


def _fire(
    rng: np.random.Generator, outputs: list[str], join_x: bool = True, side: int = 12
) -> tuple[onnx.ModelProto, dict]:
    """SqueezeNet's fire module with its input X joined in too (``join_x``): Conv 1x1 and 3x3
    with Relu on X (fused into FusedConv) -> Concat(a, b[, X]) -> Conv 3x3 with Relu ->
    GlobalAveragePool."""
    x = rng.standard_normal((1, 8, side, side)).astype(np.float32)
    w = {
        "W1": (rng.standard_normal((6, 8, 1, 1)) * 0.3).astype(np.float32),
        "W2": (rng.standard_normal((10, 8, 3, 3)) * 0.2).astype(np.float32),
        "W3": (rng.standard_normal((4, 24 if join_x else 16, 3, 3)) * 0.2).astype(np.float32),
        "B1": rng.standard_normal(6).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["a0"]),
        helper.make_node("Relu", ["a0"], ["a"]),
        helper.make_node("Conv", ["X", "W2"], ["b0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b0"], ["b"]),
        helper.make_node("Concat", ["a", "b"] + ["X"] * join_x, ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "W3"], ["d0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["d0"], ["d"]),
        helper.make_node("GlobalAveragePool", ["d"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "fire",
        [helper.make_tensor_value_info("X", F, list(x.shape))],
        [helper.make_tensor_value_info(o, F, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    ops = [helper.make_opsetid("", 17)]
    return helper.make_model(graph, opset_imports=ops, ir_version=8), {"X": x}


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("outputs", [["Y"], ["Y", "cat"]])
def test_channel_concat_keeps_channels_last_for_onednn_readers(outputs: list[str]) -> None:
    """With only oneDNN readers the Concat's output and its producers' stay channels-last (a
    warm run reorders only X, into the 3x3 convolution; the 1x1 reads it in place as a
    transposed matmul, ``conv1x1_cl.py``); as a graph output it is NCHW
    and C-contiguous. Equal to onnxruntime and to the unfused run (Conv and Relu apart)."""
    model, feeds = _fire(np.random.default_rng(3), outputs)
    want = _onnxruntime(model, feeds)
    session = anychip.load(model, devices=["cpu"])
    for _ in range(2):
        session.run(None, feeds)
    before = dict(REORDERS)
    got = session.run(None, feeds)
    moved = {k: v - before.get(k, 0) for k, v in REORDERS.items() if v != before.get(k, 0)}
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    if outputs == ["Y"]:
        assert moved == {"src": 1}, moved  # X into the 3x3; nothing else
    else:
        assert got[1].flags.c_contiguous
        assert "dst" in moved, moved  # the producers write NCHW for the output's Concat
    plain = anychip.load(model, devices=["cpu"], optimize=False).run(None, feeds)
    for g, p in zip(got, plain):
        np.testing.assert_allclose(g, p, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("replay", ["0", "1"])
def test_channel_concat_on_the_pool_at_two_threads(
    monkeypatch: pytest.MonkeyPatch, replay: str
) -> None:
    """At two threads a Concat of channels-last inputs copies on the pool's threads
    (``cpu/native/copies.concat_channels_last``), run after run and in a replay of the recorded
    calls: onnxruntime's result on new inputs each run."""
    import anychip.backends.cpu.native.fused as cg
    from anychip.backends.cpu.native import copies
    from anychip.cli.bench import _thread_limit
    from anychip.codegen import build

    if build.compiler() is None:
        pytest.skip("needs a C compiler (gcc)")
    monkeypatch.setenv("ANYCHIP_REPLAY", replay)
    calls: list[bool] = []
    real = copies.concat_channels_last

    def spy(arrays: list[np.ndarray], y: np.ndarray) -> bool:
        calls.append(real(arrays, y))
        return calls[-1]

    monkeypatch.setattr(copies, "concat_channels_last", spy)
    monkeypatch.setattr(cg, "PARALLEL_WORK", 0)  # this small Concat on the pool too
    rng = np.random.default_rng(5)
    model, feeds = _fire(rng, ["Y"], join_x=False, side=20)
    with _thread_limit(2):
        session = anychip.load(model, devices=["cpu"])
        for _ in range(4):
            feeds = {"X": rng.standard_normal(feeds["X"].shape).astype(np.float32)}
            got = session.run(None, feeds)
            np.testing.assert_allclose(got[0], _onnxruntime(model, feeds)[0], rtol=1e-4, atol=1e-4)
    assert calls and all(calls), calls


def test_channel_concat_without_onednn_is_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same model with oneDNN hidden: numpy's kernels, onnxruntime's result."""
    monkeypatch.setenv("ANYCHIP_ONEDNN", "0")
    _lib.reset()
    try:
        model, feeds = _fire(np.random.default_rng(4), ["Y"])
        got = anychip.load(model, devices=["cpu"]).run(None, feeds)
        np.testing.assert_allclose(got[0], _onnxruntime(model, feeds)[0], rtol=1e-4, atol=1e-4)
    finally:
        monkeypatch.delenv("ANYCHIP_ONEDNN")
        _lib.reset()


@pytest.mark.parametrize("group", [1, 4])
def test_depthwise_then_1x1_reads_channels_last_in_place(group: int) -> None:
    """Depthwise 3x3 -> 1x1 (groups 1 and 4, as in ShuffleNet) -> Add: the depthwise output
    stays channels-last and the 1x1 reads it in place through the strided matmul, writing
    NCHW for the numpy Add; a warm run reorders only X into the depthwise convolution.
    Equal to onnxruntime and to the unfused run."""
    rng = np.random.default_rng(5 + group)
    c = 16
    x = rng.standard_normal((2, c, 10, 10)).astype(np.float32)
    w = {
        "Wd": (rng.standard_normal((c, 1, 3, 3)) * 0.3).astype(np.float32),
        "Bd": rng.standard_normal(c).astype(np.float32),
        "Wp": (rng.standard_normal((c, c // group, 1, 1)) * 0.3).astype(np.float32),
        "Bp": rng.standard_normal(c).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "Wd", "Bd"], ["d"], group=c, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d", "Wp", "Bp"], ["p"], group=group),
        helper.make_node("Add", ["p", "X"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dw",
        [helper.make_tensor_value_info("X", F, list(x.shape))],
        [helper.make_tensor_value_info("Y", F, None)],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"X": x}
    session = anychip.load(model, devices=["cpu"])
    for _ in range(2):
        session.run(None, feeds)
    before = dict(REORDERS)
    (got,) = session.run(None, feeds)
    moved = {k: v - before.get(k, 0) for k, v in REORDERS.items() if v != before.get(k, 0)}
    assert moved == {"src": 1}, moved
    np.testing.assert_allclose(got, _onnxruntime(model, feeds)[0], rtol=1e-4, atol=1e-4)
    (plain,) = anychip.load(model, devices=["cpu"], optimize=False).run(None, feeds)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pool", ["MaxPool", "AveragePool"])
def test_pool_between_convolutions_keeps_channels_last_with_planned_memory(
    pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Conv+Relu -> pool -> Conv+Relu -> GlobalAveragePool with the arena in use: the pool
    reads the channels-last FusedConv output and, its reader being oneDNN, keeps that layout
    instead of writing the plan's NCHW buffer (which cost a numpy reorder there and a oneDNN
    one into the next convolution): a warm run reorders only X. Equal to onnxruntime."""
    from anychip.core.run import memory as memory_partition

    monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)
    rng = np.random.default_rng(21)
    x = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)
    w = {
        "W1": (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32),
        "W2": (rng.standard_normal((12, 16, 3, 3)) * 0.2).astype(np.float32),
    }
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["X", "W1"], ["a0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a0"], ["a"]),
        helper.make_node(pool, ["a"], ["p"], **attrs),
        helper.make_node("Conv", ["p", "W2"], ["b0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b0"], ["b"]),
        helper.make_node("GlobalAveragePool", ["b"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "pool",
        [helper.make_tensor_value_info("X", F, list(x.shape))],
        [helper.make_tensor_value_info("Y", F, None)],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    want = _onnxruntime(model, {"X": x})
    session = anychip.load(model, devices=["cpu"])
    for _ in range(2):
        session.run(None, {"X": x})
    (pm,) = session.compiled.part_memory.values()
    assert pm.current.arena is not None and pm.current.arena.total_size > 0
    before = dict(REORDERS)
    got = session.run(None, {"X": x})
    moved = {k: v - before.get(k, 0) for k, v in REORDERS.items() if v != before.get(k, 0)}
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    assert moved == {"src": 1}, moved  # X into the first convolution; nothing else


def test_pool_of_channels_last_for_a_numpy_reader_writes_the_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Conv+Relu (channels-last, its reader a pool) -> MaxPool -> Sigmoid: the pool's reader
    is numpy, so it writes C order, into the plan's buffer (no declined view) rather than a
    fresh array. Equal to onnxruntime."""
    from anychip.core.run import memory as memory_partition

    monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)
    rng = np.random.default_rng(22)
    x = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["a0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a0"], ["a"]),
        helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Sigmoid", ["p"], ["s"]),
        helper.make_node("Tanh", ["s"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "pool_numpy",
        [helper.make_tensor_value_info("X", F, list(x.shape))],
        [helper.make_tensor_value_info("Y", F, None)],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    want = _onnxruntime(model, {"X": x})
    session = anychip.load(model, devices=["cpu"])
    for _ in range(2):
        got = session.run(None, {"X": x})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    (pm,) = session.compiled.part_memory.values()
    by_op = {ins.node.op_type: ins for ins in pm.program.instrs}
    assert by_op["MaxPool"].takes_out
    assert pm.program.declined == 2  # the FusedConv's, kept channels-last, on each run


def test_conv_between_numpy_neighbours_moves_layouts_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sigmoid -> Conv 3x3 -> Sigmoid: the convolution reads an NCHW source and writes the
    planned NCHW output; both layout moves are ``backends/cpu/native/copies.py``'s C copies, not
    oneDNN
    reorders, and the result is onnxruntime's (seeded random values, 40x24x24)."""
    from anychip.backends.cpu.native import copies

    if copies._lib() is None:
        pytest.skip("no C compiler")
    calls = {"to_nhwc": 0, "to_nchw": 0}
    shuffle, planar = copies.shuffle_channels_last, copies.to_planar

    def to_nhwc(x: np.ndarray, group: int) -> np.ndarray | None:
        calls["to_nhwc"] += 1
        return shuffle(x, group)

    def to_nchw(x: np.ndarray, out: np.ndarray) -> bool:
        done = planar(x, out)
        calls["to_nchw"] += done
        return done

    monkeypatch.setattr(copies, "shuffle_channels_last", to_nhwc)
    monkeypatch.setattr(copies, "to_planar", to_nchw)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 40, 24, 24)).astype(np.float32)
    w = (rng.standard_normal((48, 40, 3, 3)) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Sigmoid", ["X"], ["s"]),
        helper.make_node("Conv", ["s", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "sandwich",
        [helper.make_tensor_value_info("X", F, list(x.shape))],
        [helper.make_tensor_value_info("Y", F, None)],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    got = anychip.load(model, devices=["cpu"]).run(None, {"X": x})
    np.testing.assert_allclose(got[0], _onnxruntime(model, {"X": x})[0], rtol=1e-4, atol=1e-5)
    assert calls["to_nhwc"] >= 1 and calls["to_nchw"] >= 1, calls
