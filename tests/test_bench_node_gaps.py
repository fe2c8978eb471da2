"""``bench/node_gaps.py``: both engines' per-node tables of a small seeded model name its
nodes and ops, and the op-type view puts anychip's FusedConv beside onnxruntime's Conv."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench import node_gaps


def _model(path: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B")
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        [w, b],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}


def test_both_tables_name_the_nodes_and_the_op_view_pairs_convolutions(tmp_path):
    path = str(tmp_path / "m.onnx")
    feeds = _model(path)
    ours = node_gaps.anychip_nodes(path, feeds, runs=2)
    theirs = node_gaps.onnxruntime_nodes(path, feeds, runs=2, threads=1)
    assert "MaxPool" in {op for op, _ in ours.values()}
    assert {op for op, _ in ours.values()} & {"Conv", "FusedConv"}
    assert {op for op, _ in theirs.values()} & {"Conv", "FusedConv"}
    assert all(t >= 0 for _, t in list(ours.values()) + list(theirs.values()))
    text = node_gaps._report(ours, theirs, top=2)
    conv_row = next(line for line in text.splitlines() if line.startswith("Conv "))
    assert len(conv_row.split()) == 3  # Conv, anychip us, onnxruntime us
    assert "FusedConv " not in text.split("slowest")[0]  # merged into the Conv row


def test_conv_pairs_orders_onnxruntime_by_execution_and_describes_convolutions(tmp_path):
    from bench import conv_pairs

    path = str(tmp_path / "m.onnx")
    feeds = _model(path)
    nodes = conv_pairs.onnxruntime_ordered(path, feeds, runs=2, threads=1)
    ops = [op for _, op, _ in nodes]
    assert ops.index("MaxPool") > max(i for i, op in enumerate(ops) if "Conv" in op)
    described = conv_pairs._describe(onnx.load(path))
    assert described == {"conv": "x=[1, 3, 16, 16] w=[8, 3, 3, 3] s=None g=1"}


def test_ab_revisions_times_a_model_of_the_imported_checkout():
    from bench import ab_revisions

    got = ab_revisions.time_models(["lstm"], threads=1)
    assert set(got) == {"lstm"} and 0 < got["lstm"] < 1e4


def test_ab_revisions_names_a_checkout_that_is_not_one(tmp_path, capsys):
    import pytest

    from bench import ab_revisions

    with pytest.raises(SystemExit):
        ab_revisions.main(["--old", str(tmp_path), "--models", "lstm"])
    assert "is not an anychip checkout" in capsys.readouterr().err


def test_conv_threads_times_each_convolution_at_one_and_two_threads():
    from bench import conv_threads

    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)}
    one, split1 = conv_threads.conv_times(model, feeds, 1, runs=3)
    two, split2 = conv_threads.conv_times(model, feeds, 2, runs=3)
    assert [(x, w_) for x, w_, _ in one] == [((1, 3, 12, 12), (8, 3, 3, 3))]
    assert len(one[0][2]) == 3 and all(t > 0 for t in one[0][2])
    assert split1 == 0  # one thread never splits
    text = conv_threads.report(one, two, (split1, split2), top=5)
    assert "1 convolutions" in text and "x=[1, 3, 12, 12] w=[8, 3, 3, 3]" in text
