"""``FuseChannelShufflePass`` and ``anychip::ChannelShuffle``: ShuffleNet's Reshape ->
Transpose -> Reshape as one node; before a oneDNN convolution one reorder into channels-last
(the convolution then reads it without its own reorder), before numpy readers a copy into the
plan. Equal to onnxruntime, the unfused graph and the graph without the pass, on seeded random
inputs and weights, with and without planned memory."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.kernels.op_channel_shuffle import channel_shuffle
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn import kernels as onednn_kernels
from anychip.backends.cpu.onednn._prim import REORDERS
from anychip.core.run import memory as memory_partition
from anychip.errors import KernelError

F = TensorProto.FLOAT
G, C, HW = 4, 16, 10


def _unit(reader: str, perm=(0, 2, 1, 3, 4), back=(1, C, HW, HW)) -> onnx.ModelProto:
    """A ShuffleNet v1 unit's start: grouped 1x1 Conv + Relu -> shuffle -> ``reader``
    (a depthwise 3x3 Conv, or Sigmoid) -> Relu."""
    rng = np.random.default_rng(31)
    inits = {
        "Wg": (rng.standard_normal((C, 8 // G, 1, 1)) * 0.4).astype(np.float32),
        "Wd": (rng.standard_normal((C, 1, 3, 3)) * 0.4).astype(np.float32),
        "s5": np.array([1, G, C // G, HW, HW], np.int64),
        "s4": np.array(back, np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["X", "Wg"], ["g0"], group=G),
        helper.make_node("Relu", ["g0"], ["g"]),
        helper.make_node("Reshape", ["g", "s5"], ["a"]),
        helper.make_node("Transpose", ["a"], ["b"], perm=list(perm)),
        helper.make_node("Reshape", ["b", "s4"], ["sh"]),
    ]
    if reader == "Conv":
        nodes.append(helper.make_node("Conv", ["sh", "Wd"], ["d"], group=C, pads=[1] * 4))
    else:
        nodes.append(helper.make_node(reader, ["sh"], ["d"]))
    nodes.append(helper.make_node("Relu", ["d"], ["Y"]))
    graph = helper.make_graph(
        nodes,
        "shuffle_unit",
        [helper.make_tensor_value_info("X", F, [1, 8, HW, HW])],
        [helper.make_tensor_value_info("Y", F, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _runs(model: onnx.ModelProto, **options) -> tuple[anychip.Session, list[np.ndarray]]:
    sess = anychip.load(
        model.SerializeToString(), "cpu", device_options={"cpu": options} if options else None
    )
    rng = np.random.default_rng(7)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = []
    for _ in range(2):
        feeds = {"X": rng.standard_normal((1, 8, HW, HW)).astype(np.float32)}
        got, want = sess.run(None, feeds)[0], ref.run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        outs.append(got)
    return sess, outs


@pytest.mark.parametrize("arena", [True, False])
@pytest.mark.parametrize("reader", ["Conv", "Sigmoid"])
def test_shuffle_is_one_node_equal_to_every_other_path(reader, arena, monkeypatch):
    if arena:
        monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)
    model = _unit(reader)
    sess, fused = _runs(model)
    assert sess.partitions[0].info["fusions"]["fuse_channel_shuffle"] == 1
    ops = [n.op_type for n in sess.partitions[0].graph.nodes]
    assert "ChannelShuffle" in ops and "Transpose" not in ops
    for options in ({"fusion": False}, {"disabled_passes": ["fuse_channel_shuffle"]}):
        _, other = _runs(model, **options)
        for a, b in zip(fused, other):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_before_a_onednn_convolution_the_shuffle_is_the_only_reorder(monkeypatch):
    """With the pass the depthwise convolution reads the shuffle's channels-last output in
    place: one reorder fewer per run than without it."""
    assert _lib.available(), _lib.unavailable_reason()
    monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)
    monkeypatch.setenv("ANYCHIP_REPLAY", "0")  # the kernels' path counted: not a replay
    model = _unit("Conv")
    counts = {}
    for name, options in (("on", {}), ("off", {"disabled_passes": ["fuse_channel_shuffle"]})):
        sess, _ = _runs(model, **options)
        feeds = {"X": np.random.default_rng(1).standard_normal((1, 8, HW, HW), np.float32)}
        before, runs_before = sum(REORDERS.values()), dict(onednn_kernels.RUNS)
        sess.run(None, feeds)
        counts[name] = sum(REORDERS.values()) - before
        if name == "on":
            served = onednn_kernels.RUNS[("ChannelShuffle", "onednn")]
            assert served - runs_before.get(("ChannelShuffle", "onednn"), 0) == 1
    assert counts["on"] == counts["off"] - 1, counts


@pytest.mark.parametrize(
    "perm, back", [((0, 1, 2, 4, 3), (1, C, HW, HW)), ((0, 2, 1, 3, 4), (1, C // 2, 2 * HW, HW))]
)
def test_other_reshape_transpose_chains_are_left_alone(perm, back):
    sess, _ = _runs(_unit("Sigmoid", perm, back))
    assert "fuse_channel_shuffle" not in sess.partitions[0].info.get("fusions", {})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_matches_the_formula(dtype):
    x = np.random.default_rng(2).standard_normal((2, 12, 3, 5)).astype(dtype)
    for g in (1, 2, 3, 4, 6, 12):
        m = 12 // g
        want = x[:, [(j % g) * m + j // g for j in range(12)]]
        np.testing.assert_array_equal(channel_shuffle(x, group=g), want)
        out = np.empty_like(x)
        assert channel_shuffle(x, group=g, out=out) is out
        np.testing.assert_array_equal(out, want)
    with pytest.raises(KernelError, match="5 groups do not divide the 12 channels"):
        channel_shuffle(x, group=5)


@pytest.mark.parametrize("compiler", [True, False])
def test_before_a_convolution_the_generated_copy_shuffles_else_the_reorder(compiler, monkeypatch):
    """With a C compiler the shuffle before the depthwise convolution is the generated copy
    (``cpu/native/copies.py``); with it hidden, oneDNN's reorder. Both equal onnxruntime."""
    assert _lib.available(), _lib.unavailable_reason()
    from anychip.backends.cpu.native import copies
    from anychip.backends.cpu.onednn import shuffle as shuffle_mod
    from anychip.codegen import build

    if compiler and build.compiler() is None:
        pytest.skip("needs a C compiler (gcc)")
    if not compiler:
        monkeypatch.setenv("CC", "/nonexistent/cc")
    copies.forget()
    made = []
    real = copies.shuffle_channels_last

    def counted(x, group):
        y = real(x, group)
        made.append(y is not None)
        return y

    monkeypatch.setattr(shuffle_mod.copies, "shuffle_channels_last", counted)
    try:
        _runs(_unit("Conv"))
    finally:
        monkeypatch.delenv("CC", raising=False)
        copies.forget()
    assert made and all(m == compiler for m in made), made
