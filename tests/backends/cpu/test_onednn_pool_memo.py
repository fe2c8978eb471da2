"""The oneDNN pooling kernels: their per-node memo (``onednn/pool.py``, ``kernels.pool``): the same
node called with sources of other shapes, other layouts (NCHW, channels-last) and a
non-contiguous view finds or makes the right primitive each time; results equal
onnxruntime's on seeded random inputs; a cloned node keeps a memo of its own. A pool of a
channels-last source for a numpy reader writes NCHW through the generated transpose."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn import kernels as K
from anychip.backends.cpu.onednn._prim import from_channels_last

ATTRS = {
    "MaxPool": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0]},
    "AveragePool": {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    "GlobalAveragePool": {},
    "GlobalMaxPool": {},
}


class _Node:
    def __init__(self) -> None:
        self.meta: dict = {"onednn_channels_last": False}
        self.outputs: list = []


class _Ctx:
    def __init__(self, node: _Node) -> None:
        self.node = node
        self.num_outputs = 1


def _onnxruntime(op: str, x: np.ndarray) -> np.ndarray:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], **ATTRS[op])],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": np.ascontiguousarray(x)})[0]


def _call(op: str, ctx: _Ctx, x: np.ndarray) -> np.ndarray:
    fn = {
        "MaxPool": K.max_pool,
        "AveragePool": K.average_pool,
        "GlobalAveragePool": K.global_average_pool,
        "GlobalMaxPool": K.global_max_pool,
    }[op]
    return fn(ctx, x, **ATTRS[op])


@pytest.mark.parametrize("op", list(ATTRS))
def test_one_node_over_shapes_and_layouts_equals_onnxruntime(op):
    assert _lib.available(), _lib.unavailable_reason()
    rng = np.random.default_rng(11)
    ctx = _Ctx(_Node())
    sources = []
    for shape in [(1, 16, 9, 11), (2, 8, 12, 7), (1, 16, 9, 11)]:
        x = rng.standard_normal(shape).astype(np.float32)
        sources += [x, from_channels_last(np.ascontiguousarray(x.transpose(0, 2, 3, 1)))]
    wide = rng.standard_normal((1, 32, 9, 11)).astype(np.float32)
    sources.append(wide[:, ::2])  # neither layout: made C-contiguous first
    for _ in range(2):  # the second round finds every entry in the memo
        for x in sources:
            got = _call(op, ctx, x)
            np.testing.assert_allclose(got, _onnxruntime(op, x), rtol=1e-5, atol=1e-6)
    kept = ctx.node.meta["onednn_pool"]
    assert kept[0] is ctx.node and len(kept[1]) == 5  # 2 shapes x 2 layouts + the view


def test_a_cloned_node_gets_a_memo_of_its_own():
    assert _lib.available(), _lib.unavailable_reason()
    x = np.random.default_rng(12).standard_normal((1, 8, 6, 6)).astype(np.float32)
    node = _Node()
    _call("MaxPool", _Ctx(node), x)
    clone = _Node()
    clone.meta.update(node.meta)  # as ir/clone.py copies meta
    _call("MaxPool", _Ctx(clone), x)
    assert clone.meta["onednn_pool"][0] is clone
    assert clone.meta["onednn_pool"][1] is not node.meta["onednn_pool"][1]


def test_a_channels_last_pool_for_a_numpy_reader_is_transposed_in_c(monkeypatch):
    """Conv (channels-last for its oneDNN reader) -> MaxPool -> Sigmoid (numpy): the pool's
    NCHW output is the generated tile transpose's (``cpu/native/copies.to_planar``); equal to
    onnxruntime."""
    import anychip
    from anychip.backends.cpu.native import copies
    from anychip.codegen import build

    if build.compiler() is None:
        pytest.skip("needs a C compiler (gcc)")
    rng = np.random.default_rng(13)
    w = (rng.standard_normal((24, 3, 3, 3)) * 0.3).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
            helper.make_node("Sigmoid", ["p"], ["y"]),
        ],
        "pool_planar",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor(name="w", data_type=TensorProto.FLOAT, dims=w.shape, vals=w.ravel())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    done = []
    real = copies.to_planar

    def counted(x, out):
        done.append(real(x, out))
        return done[-1]

    monkeypatch.setattr(copies, "to_planar", counted)
    feeds = {"x": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = anychip.load(model.SerializeToString(), "cpu").run(None, feeds)[0]
    np.testing.assert_allclose(got, ref.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
    assert done and all(done), done
