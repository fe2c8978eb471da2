"""Dropout at inference is a view of its input (no copy), planned as an alias: results equal
onnxruntime's with planned memory and an in-place op after it, and an output that is the
Dropout of a graph input never aliases the caller's feed. (The layout pass removes an
inference Dropout whose mask is unread; the first test keeps it by turning that pass off.)"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.core.run import memory as memory_partition

F = TensorProto.FLOAT


def _model(nodes, outputs):
    graph = helper.make_graph(
        nodes,
        "dropout",
        [helper.make_tensor_value_info("x", F, [1, 64, 32])],
        [helper.make_tensor_value_info(o, F, [1, 64, 32]) for o in outputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=8)


def test_inference_dropout_is_a_view_and_planned_as_one(monkeypatch):
    monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Dropout", ["s"], ["d", "mask"], ratio=0.5),
        helper.make_node("Relu", ["d"], ["r"]),  # in place over d would write over s
        helper.make_node("Add", ["r", "s"], ["y"]),
    ]
    model = _model(nodes, ["y"])
    cpu = {"disabled_passes": ["eliminate_transpose_reshape"]}
    sess = anychip.load(model.SerializeToString(), "cpu", device_options={"cpu": cpu})
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for _ in range(2):
        feeds = {"x": rng.standard_normal((1, 64, 32)).astype(np.float32)}
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-5, atol=1e-6
        )
    (pm,) = sess.compiled.part_memory.values()
    slots = {v.name: s for v, s in pm.program.slot_of.items()}
    assert slots["d"] in pm.program.alias_slots


@pytest.mark.parametrize("outputs", [["d"], ["d", "mask"]])
def test_dropout_of_a_feed_does_not_alias_it(outputs):
    model = _model([helper.make_node("Dropout", ["x"], outputs)], outputs[:1])
    sess = anychip.load(model.SerializeToString(), "cpu")
    x = np.random.default_rng(5).standard_normal((1, 64, 32)).astype(np.float32)
    kept = x.copy()
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, kept)
    y += 1
    np.testing.assert_array_equal(x, kept)


def test_kernel_returns_a_view():
    from anychip.backends.cpu.kernels import op_dropout

    class Ctx:
        num_outputs = 1

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = op_dropout.dropout_v7(Ctx(), x, ratio=0.5)
    assert np.shares_memory(x, y) and np.array_equal(x, y)


@pytest.mark.parametrize("opset", [13])
def test_the_mask_as_an_output_equals_onnxruntime(opset):
    """The all-ones mask handed to the caller is a writable array of its own. (Before opset
    10 the float mask is all ones here, as before this kernel's change; onnxruntime gives
    zeros there.)"""
    graph = helper.make_graph(
        [helper.make_node("Dropout", ["x"], ["d", "mask"])],
        "dropout_mask",
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [
            helper.make_tensor_value_info("d", F, [2, 3]),
            helper.make_tensor_value_info("mask", F if opset < 10 else TensorProto.BOOL, [2, 3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    feeds = {"x": np.random.default_rng(6).standard_normal((2, 3)).astype(np.float32)}
    got = anychip.load(model.SerializeToString(), "cpu").run(None, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.flags.writeable
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("kernel, dtype", [("dropout_v7", np.float32), ("dropout_v10", np.bool_)])
def test_the_mask_is_made_once_per_shape(kernel, dtype):
    """An inference Dropout's constant mask (zeros in these opsets) is the same read-only
    array on every call of a shape (nothing made per run), another for another shape."""
    from anychip.backends.cpu.kernels import op_dropout

    class Ctx:
        num_outputs = 2

    fn = getattr(op_dropout, kernel)
    x = np.random.default_rng(8).standard_normal((1, 8, 3, 3)).astype(np.float32)
    (_, m1), (_, m2) = fn(Ctx(), x, ratio=0.5), fn(Ctx(), x + 1, ratio=0.5)
    assert m1 is m2 and m1.dtype == dtype and m1.shape == x.shape
    assert not m1.flags.writeable and not np.any(m1)
    (_, m3) = fn(Ctx(), x[:, :4], ratio=0.5)
    assert m3 is not m1 and m3.shape == (1, 4, 3, 3) and not np.any(m3)


@pytest.mark.parametrize("opset", [7, 9, 10, 11, 12, 13])
def test_inference_mask_as_onnxruntime_fills_it(opset):
    # zeros in opsets 7-11 (onnxruntime's identity kernel), ones from 12: onnxruntime's own
    # transform/dropout.onnx (opset 10) reads the mask
    mask_type = F if opset < 10 else TensorProto.BOOL
    graph = helper.make_graph(
        [
            helper.make_node(
                "Dropout", ["x"], ["d", "mask"], **({"ratio": 0.3} if opset < 12 else {})
            )
        ],
        "dropout",
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [
            helper.make_tensor_value_info("d", F, [2, 3]),
            helper.make_tensor_value_info("mask", mask_type, [2, 3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)
    x = np.random.default_rng(opset).standard_normal((2, 3)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = ref.run(None, {"x": x})
    got = anychip.load(model.SerializeToString(), "cpu").run(None, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
