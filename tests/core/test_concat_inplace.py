"""In-place Concat (``core/run/concat_inplace.py``): a Concat's inputs planned inside its
output, their producers writing their slices, the Concat copying only what is not in place.
Every session result is compared with onnxruntime on seeded random inputs and weights, over
two runs with different inputs (the arena is reused between them)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

import anychip
from anychip.backends.cpu.kernels import op_concat
from anychip.core.run import memory as memory_partition
from anychip.core.run.concat_inplace import resolve

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True)
def _every_arena_used(monkeypatch):
    monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)


@pytest.fixture
def in_place(monkeypatch):
    """Counts the Concat inputs found already in place (not copied)."""
    found = []
    real = op_concat._same_memory

    def spy(x, dst):
        same = real(x, dst)
        found.append(same)
        return same

    monkeypatch.setattr(op_concat, "_same_memory", spy)
    return found


class _Graph:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []

    def conv(self, x: str, cin: int, cout: int, name: str, k: int = 3) -> str:
        w = (self.rng.standard_normal((cout, cin, k, k)) * 0.2).astype(np.float32)
        self.inits.append(numpy_helper.from_array(w, name + "_w"))
        p = k // 2
        self.op("Conv", [x, name + "_w"], name, kernel_shape=[k, k], pads=[p] * 4)
        return name

    def op(self, op: str, ins: list[str], out: str, **attrs: object) -> str:
        self.nodes.append(h.make_node(op, ins, [out], name=out + "_n", **attrs))
        return out

    def model(self, c: int, hw: int, outs: list[tuple[str, int]], n: int = 1) -> onnx.ModelProto:
        graph = h.make_graph(
            self.nodes,
            "g",
            [h.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])],
            [h.make_tensor_value_info(o, TensorProto.FLOAT, [n, oc, hw, hw]) for o, oc in outs],
            self.inits,
        )
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _dense_block(layers: int = 4, growth: int = 8, c0: int = 8, n: int = 1) -> onnx.ModelProto:
    """DenseNet's block: ``x[k+1] = Concat(x[k], conv(relu(x[k])))``, nested Concats."""
    g = _Graph(7)
    x = g.conv("x", 3, c0, "stem")
    c = c0
    for k in range(layers):
        r = g.op("Relu", [x], f"r{k}")
        y = g.conv(r, c, growth, f"conv{k}")
        x = g.op("Concat", [x, y], f"cat{k}", axis=1)
        c += growth
    g.op("Sigmoid", [x], "y")
    return g.model(3, 12, [("y", c)], n)


def _compare(model: onnx.ModelProto, shape: tuple[int, ...], **load: object) -> anychip.Session:
    sess = anychip.load(model, devices=["cpu"], **load)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for _ in range(2):
        x = rng.standard_normal(shape).astype(np.float32)
        got = sess.run(None, {"x": x})
        want = ref.run(None, {"x": x})
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    return sess


def _plan(sess: anychip.Session):
    (pm,) = sess.compiled.part_memory.values()
    return pm


def test_dense_block_writes_every_layer_in_place(in_place):
    sess = _compare(_dense_block(), (1, 3, 12, 12))
    pm = _plan(sess)
    inside = pm.current.inside
    by_name = {v.name: s for v, s in pm.program.slot_of.items()}
    # every conv output and every inner Concat's output is inside the last Concat's output
    plane = 12 * 12 * 4
    top = pm.current.arena.offsets[by_name["cat3"]]
    for name in ["conv0", "conv1", "conv2", "conv3", "cat0", "cat1", "cat2", "stem"]:
        assert top <= inside[by_name[name]] < top + 40 * plane, name
    # the nested offsets: conv k sits after stem's 8 channels and k layers of 8
    for k in range(4):
        assert inside[by_name[f"conv{k}"]] == top + (8 + 8 * k) * plane
    assert in_place and all(in_place)  # no Concat input was copied
    assert pm.program.declined == 0


def test_unfused_and_fused_runs_agree():
    model = _dense_block()
    x = np.random.default_rng(5).standard_normal((1, 3, 12, 12)).astype(np.float32)
    fused = anychip.load(model, devices=["cpu"]).run(None, {"x": x})[0]
    plain = anychip.load(model, devices=["cpu"], device_options={"cpu": {"fusion": False}})
    np.testing.assert_allclose(plain.run(None, {"x": x})[0], fused, rtol=1e-5, atol=1e-6)


def test_batch_two_is_not_placed():
    """With a batch of 2 a channel slice is not one run of bytes: left to the copy."""
    sess = _compare(_dense_block(layers=2, n=2), (2, 3, 12, 12))
    assert _plan(sess).current.inside == {}


def test_repeated_input_and_late_reader_stay_correct(in_place):
    """``Concat(a, a)`` leaves ``a`` out; ``b`` read again long after the Concat died keeps the
    Concat's memory alive (nothing planned over it), and an in-place Relu over a member is not
    allowed to write into the Concat's output."""
    g = _Graph(11)
    a = g.conv("x", 3, 4, "a")
    b = g.conv("x", 3, 4, "b")
    g.op("Concat", [a, a, b], "cat", axis=1)
    g.op("Sigmoid", ["cat"], "s")
    t = g.conv("s", 12, 4, "t")
    u = g.op("Tanh", [t], "u")
    g.op("Relu", [b], "rb")  # b dies here: an in-place hint would write over cat's slice
    g.op("Add", [u, "rb"], "y")
    sess = _compare(g.model(3, 10, [("y", 4)]), (1, 3, 10, 10))
    pm = _plan(sess)
    by_name = {v.name: s for v, s in pm.program.slot_of.items()}
    assert by_name["a"] not in pm.current.inside
    assert by_name["b"] in pm.current.inside
    assert in_place.count(True) == 2  # b, on each of the two runs


def test_negative_axis_and_partial_members():
    """Axis -3 is the channel axis; an input from outside the partition (the graph input)
    is copied, the others placed."""
    g = _Graph(13)
    a = g.conv("x", 3, 5, "a")
    g.op("Concat", ["x", a], "cat", axis=-3)
    g.op("Relu", ["cat"], "y")
    sess = _compare(g.model(3, 9, [("y", 8)]), (1, 3, 9, 9))
    pm = _plan(sess)
    by_name = {v.name: s for v, s in pm.program.slot_of.items()}
    assert pm.current.inside == {
        by_name["a"]: pm.current.arena.offsets[by_name["cat"]] + 3 * 81 * 4
    }


def test_concat_kernel_copies_what_is_not_in_place():
    rng = np.random.default_rng(2)
    base = np.empty(100, np.float32)
    out = base[:96].reshape(1, 6, 4, 4)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    placed = base[32:96].reshape(1, 4, 4, 4)
    placed[...] = rng.standard_normal((1, 4, 4, 4))
    want = np.concatenate([x, placed.copy()], axis=1)
    got = op_concat.concat(x, placed, axis=1, out=out)
    assert got is out
    np.testing.assert_array_equal(got, want)
    # off-axis shapes that differ are refused, never broadcast
    with pytest.raises(Exception, match="differ outside axis"):
        op_concat.concat(x[:, :, :1], placed, axis=1, out=out)


def test_resolve_follows_nested_concats():
    placed = {1: (5, 0), 5: (9, 64), 2: (5, 32)}
    assert resolve(placed, 1) == (9, 64)
    assert resolve(placed, 2) == (9, 96)
    assert resolve(placed, 9) == (9, 0)
