"""Split's pieces are the input's views, in np.split's shapes and values, on every axis and
with empty pieces (the kernel slices them itself, without np.split's wrapper)."""

from __future__ import annotations

import numpy as np
import pytest

from anychip.backends.cpu.kernels.op_split import _split


@pytest.mark.parametrize(
    "axis, sizes",
    [(0, [1, 0]), (1, [64, 64]), (1, [0, 128]), (-2, [100, 28]), (2, [32, 32, 32]), (-1, [10, 86])],
)
def test_pieces_are_views_equal_to_np_split(axis, sizes):
    x = np.random.default_rng(len(sizes) + axis).standard_normal((1, 128, 96)).astype(np.float32)
    got = _split(x, axis, sizes, len(sizes))
    want = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and np.array_equal(g, w)
        assert g.size == 0 or np.shares_memory(g, x)


def test_pieces_are_planned_as_views_of_the_input(monkeypatch):
    """Split is registered alias=True: with the arena in use its pieces are views of the
    planned input (the executor does not copy them), the input stays alive while they do,
    and the results equal onnxruntime's over runs with new inputs."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import anychip
    from anychip.core.run import memory as memory_partition

    monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"]),
        helper.make_node("Split", ["s"], ["a", "b", "c"], axis=2, num_outputs=3),
        helper.make_node("Tanh", ["a"], ["ta"]),  # an in-place op may not write over s
        helper.make_node("Mul", ["ta", "b"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "split",
        [helper.make_tensor_value_info("x", f, [1, 64, 96])],
        [helper.make_tensor_value_info("y", f, [1, 64, 32])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    options = {"cpu": {"fusion": False}}
    sess = anychip.load(model.SerializeToString(), "cpu", device_options=options)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(8)
    for _ in range(3):
        feeds = {"x": rng.standard_normal((1, 64, 96)).astype(np.float32)}
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-5, atol=1e-6
        )
    (pm,) = sess.compiled.part_memory.values()
    slots = {v.name: s for v, s in pm.program.slot_of.items()}
    assert {slots["a"], slots["b"], slots["c"]} <= pm.program.alias_slots
    assert pm.current.arena is not None and slots["s"] in pm.current.arena.offsets
