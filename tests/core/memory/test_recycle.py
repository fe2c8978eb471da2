"""A partition's output arrays taken again once the caller drops them (``core/memory/
recycle.py``): reused only then, never while the caller holds the array, a view of it or a
buffer of it; on the kernels' path (one node, ``out=``) and on the replay's; the values equal
numpy's on new random inputs each run."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.replay.run import REPLAY_FROM
from anychip.core.memory import recycle

SHAPE = (1, 16, 64, 64)  # 256 KiB: over recycle.MIN_BYTES


def _model(nodes: int) -> onnx.ModelProto:
    """One Relu (the kernels' path: a partition of one node is not replayed), or a
    convolution, a pool and a second convolution (replayed); a 256 KiB output."""
    if nodes == 1:
        body, inits = [helper.make_node("Relu", ["x"], ["y"])], []
    else:
        rng = np.random.default_rng(7)
        w1, w2 = (rng.standard_normal((16, 16, k, k)).astype(np.float32) * 0.2 for k in (3, 1))
        inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]
        body = [
            helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a"], ["b"]),
            helper.make_node("MaxPool", ["b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["c", "w2"], ["y"]),
        ]
    g = helper.make_graph(
        body,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _reference(model: onnx.ModelProto):
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda x: ref.run(None, {"x": x})[0]


def _outputs(sess: anychip.Session) -> recycle.Outputs:
    (pm,) = sess.compiled.part_memory.values()
    return pm.outputs


@pytest.mark.parametrize("nodes", [1, 3])  # the kernels' path; a replayed partition
def test_dropped_outputs_are_reused_held_ones_never(nodes: int) -> None:
    model = _model(nodes)
    sess = anychip.load(model.SerializeToString(), devices=["cpu"])
    want = _reference(model)
    rng = np.random.default_rng(nodes)
    for _ in range(REPLAY_FROM + 5):  # dropped each run: past the replay's recording
        x = rng.standard_normal(SHAPE).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want(x), rtol=1e-5, atol=1e-5)
    assert _outputs(sess).reused >= 5
    (pm,) = sess.compiled.part_memory.values()
    # the replay is installed for the 3-node partition (its trace may be dropped when the
    # machine is busy and a replay measures slower: the kernels' path is then checked twice)
    assert (nodes > 1) == (pm.around is not None)
    held = []
    for _ in range(4):  # the arrays, a view, a memoryview: none is written again
        x = rng.standard_normal(SHAPE).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        held.append((y, y.copy()))
    x = rng.standard_normal(SHAPE).astype(np.float32)
    view = sess.run(None, {"x": x})[0][0, 3]
    want_view = want(x)[0, 3]
    x = rng.standard_normal(SHAPE).astype(np.float32)
    buf = memoryview(sess.run(None, {"x": x})[0])
    want_buf = want(x)
    for _ in range(4):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want(x), rtol=1e-5, atol=1e-5)
    for y, kept in held:
        np.testing.assert_array_equal(y, kept)
    assert len({id(y) for y, _ in held}) == len(held)
    np.testing.assert_allclose(view, want_view, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(buf), want_buf, rtol=1e-5, atol=1e-5)


def test_a_reused_output_is_the_same_memory() -> None:
    """Dropped, the next run's output lives where the last one did (no fresh pages)."""
    sess = anychip.load(_model(1).SerializeToString(), devices=["cpu"])
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    where = sess.run(None, {"x": x})[0].__array_interface__["data"][0]
    assert sess.run(None, {"x": x})[0].__array_interface__["data"][0] == where


def test_small_outputs_and_other_shapes_are_made_anew() -> None:
    kept = recycle.Outputs()
    small = np.zeros(16, np.float32)
    kept.keep([small])
    assert kept.take(0, small.shape, small.dtype) is None
    big = np.zeros(recycle.MIN_BYTES // 4, np.float32)
    kept.keep([big])
    assert kept.take(0, (1,) + big.shape, big.dtype) is None  # another shape: not given
    kept.keep([big])
    assert kept.take(0, big.shape, np.dtype(np.float64)) is None
    kept.keep([big])
    del big
    assert kept.take(0, (recycle.MIN_BYTES // 4,), np.dtype(np.float32)) is not None


def test_the_count_an_array_alone_has_is_what_a_held_one_exceeds() -> None:
    """The calibration the reuse rests on: held by a local elsewhere, an array is not free."""
    kept = recycle.Outputs()
    a = np.zeros(recycle.MIN_BYTES, np.uint8)
    kept.keep([a])
    assert kept.take(0, a.shape, a.dtype) is None  # ``a`` still holds it
    kept.keep([a])
    view = a[1:]
    del a
    assert kept.take(0, (recycle.MIN_BYTES,), np.dtype(np.uint8)) is None  # the view does
    assert view.base is not None


def test_a_run_leaves_no_frame_of_its_slots_behind() -> None:
    """A node's context (the fused convolution has one) drops the run's slots after its call,
    or the last run's outputs and inputs stay referenced until the next."""
    sess = anychip.load(_model(3).SerializeToString(), devices=["cpu"])
    sess.run(None, {"x": np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)})
    (pm,) = sess.compiled.part_memory.values()
    ctxs = [ins.ctx for ins in pm.program.instrs if ins.ctx is not None]
    assert ctxs
    assert all(c._frame is None for c in ctxs)
