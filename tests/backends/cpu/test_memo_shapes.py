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
