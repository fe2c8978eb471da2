"""MemoShapesPass: the shape-only nodes of a symbolic-length graph become one ShapeMemo node,
run once per input shape; equal to the unmemoized graph and onnxruntime at several lengths."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import anychip

N = helper.make_node
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data")


def _causal_mask_model() -> onnx.ModelProto:
    """y = x + where(arange(S)[None] <= arange(S)[:, None], 0, -1e4) + pos[:S], from x's
    shape only (Shape, Gather, Range, Unsqueeze, LessOrEqual, Where, Slice)."""
    rng = np.random.default_rng(7)
    inits = {
        "zero": np.array(0, np.int64),
        "one": np.array(1, np.int64),
        "ax0": np.array([0], np.int64),
        "ax1": np.array([1], np.int64),
        "fz": np.array(0.0, np.float32),
        "fneg": np.array(-1e4, np.float32),
        "pos": rng.standard_normal((64, 64)).astype(np.float32),
    }
    nodes = [
        N("Shape", ["x"], ["shp"]),
        N("Gather", ["shp", "one"], ["s"], axis=0),
        N("Range", ["zero", "s", "one"], ["r"]),
        N("Unsqueeze", ["r", "ax0"], ["row"]),
        N("Unsqueeze", ["r", "ax1"], ["col"]),
        N("LessOrEqual", ["row", "col"], ["keep"]),
        N("Where", ["keep", "fz", "fneg"], ["mask"]),
        N("Unsqueeze", ["s", "ax0"], ["s1"]),
        N("Slice", ["pos", "ax0", "s1", "ax0"], ["p"]),
        N("Slice", ["p", "ax0", "s1", "ax1"], ["pp"]),
        N("Add", ["x", "mask"], ["xm"]),
        N("Add", ["xm", "pp"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "memo",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "S", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "S", "S"])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _check(m: onnx.ModelProto, feeds_at) -> anychip.Session:
    data = m.SerializeToString()
    memo = anychip.load(data, "cpu")
    plain = anychip.load(data, "cpu", device_options={"cpu": {"disabled_passes": ["memo_shapes"]}})
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for length in (5, 9, 5, 33, 9):  # repeated lengths are served from the memo
        feeds = feeds_at(length)
        want = ref.run(None, feeds)
        for a, b, w in zip(memo.run(None, feeds), plain.run(None, feeds), want):
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(a, b)
    return memo


def test_shape_only_nodes_run_once_per_length() -> None:
    rng = np.random.default_rng(0)
    memo = _check(
        _causal_mask_model(),
        lambda s: {"x": rng.standard_normal((2, s, s)).astype(np.float32)},
    )
    assert memo.partitions[0].info["fusions"]["memo_shapes"] == 10
    (node,) = [n for n in memo.partitions[0].graph.nodes if n.op_type == "ShapeMemo"]
    kept = node.meta["shape_memo"]
    assert sorted(k[0][0] for k in kept) == [(2, 5, 5), (2, 9, 9), (2, 33, 33)]
    assert all(not a.flags.writeable for entry in kept.values() for a in entry)


def test_hugging_face_exports_masks_memoized() -> None:
    """The tiny GPT-2 export's position ids and causal mask (42 nodes), the tiny BERT's
    (28 nodes; its padding mask reads attention_mask's values and stays outside)."""
    rng = np.random.default_rng(1)
    for name, count in (("hf_gpt2_tiny", 42), ("hf_bert_tiny", 28)):
        m = onnx.load(os.path.join(DATA, f"{name}.onnx"))
        with_mask = any(i.name == "attention_mask" for i in m.graph.input)

        def feeds(s: int, with_mask: bool = with_mask) -> dict:
            f = {"input_ids": rng.integers(0, 128, (1, s)).astype(np.int64)}
            if with_mask:
                f["attention_mask"] = (rng.random((1, s)) < 0.7).astype(np.int64)
            return f

        memo = _check(m, feeds)
        assert memo.partitions[0].info["fusions"]["memo_shapes"] == count


def test_nothing_memoized_without_a_shape_read() -> None:
    m = _causal_mask_model()
    del m.graph.node[:]
    m.graph.node.extend([N("Relu", ["x"], ["y"])])
    s = anychip.load(m.SerializeToString(), "cpu")
    assert "memo_shapes" not in s.partitions[0].info.get("fusions", {})


def _heads_model() -> onnx.ModelProto:
    """An export's head split of an intermediate ``h = x @ w``: ``Reshape(h, Concat(
    Unsqueeze(Gather(Shape(h), 0)), Unsqueeze(Gather(Shape(h), 1)), [2, -1]))``, then a
    transpose and the heads' sum."""
    rng = np.random.default_rng(11)
    inits = {
        "w": rng.standard_normal((8, 8)).astype(np.float32),
        "i0": np.array(0, np.int64),
        "i1": np.array(1, np.int64),
        "ax0": np.array([0], np.int64),
        "tail": np.array([2, -1], np.int64),
    }
    nodes = [
        N("MatMul", ["x", "w"], ["h"]),
        N("Shape", ["h"], ["sh"]),
        N("Gather", ["sh", "i0"], ["b"], axis=0),
        N("Shape", ["h"], ["sh2"]),
        N("Gather", ["sh2", "i1"], ["s"], axis=0),
        N("Unsqueeze", ["b", "ax0"], ["b1"]),
        N("Unsqueeze", ["s", "ax0"], ["s1"]),
        N("Concat", ["b1", "s1", "tail"], ["target"], axis=0),
        N("Reshape", ["h", "target"], ["heads"]),
        N("Transpose", ["heads"], ["t"], perm=[0, 2, 1, 3]),
        N("ReduceSum", ["t", "ax0"], ["y"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "heads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shapes_of_intermediate_values_memoized() -> None:
    rng = np.random.default_rng(2)
    memo = _check(
        _heads_model(),
        lambda s: {"x": rng.standard_normal((1 + s % 3, s, 8)).astype(np.float32)},
    )
    assert memo.partitions[0].info["fusions"]["memo_value_shapes"] == 7
    (node,) = [n for n in memo.partitions[0].graph.nodes if n.op_type == "ShapeMemo"]
    assert [v.name for v in node.inputs] == ["h"]  # keyed on the intermediate's own shape
    assert len(node.meta["shape_memo"]) == 3


def test_shape_group_read_before_its_source_is_left_alone() -> None:
    """A group that joins a shape read before an intermediate with that intermediate's shape
    cannot be one node placed after both: it stays as written, and the answers are right."""
    rng = np.random.default_rng(3)
    inits = {"i1": np.array(1, np.int64), "ax0": np.array([0], np.int64)}
    nodes = [
        N("Shape", ["x"], ["sx"]),
        N("Gather", ["sx", "i1"], ["s"], axis=0),
        N("Unsqueeze", ["s", "ax0"], ["s1"]),
        N("Cast", ["s1"], ["sf"], to=TensorProto.FLOAT),
        N("Add", ["x", "sf"], ["h"]),  # reads the group, and is the source of its second half
        N("Shape", ["h"], ["sh"]),
        N("Gather", ["sh", "i1"], ["t"], axis=0),
        N("Unsqueeze", ["t", "ax0"], ["t1"]),
        N("Concat", ["s1", "t1"], ["both"], axis=0),
        N("Reshape", ["h", "both"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "late",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    memo = _check(m, lambda s: {"x": rng.standard_normal((s, s)).astype(np.float32)})
    assert "memo_value_shapes" not in memo.partitions[0].info.get("fusions", {})
