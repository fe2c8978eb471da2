"""The ops ``claims.TESTED`` names: their kit cases feed shapes, axes and pads from the model's
inputs (int64 that ``int64.py`` keeps off OpenVINO), so they are checked here with constant
ones, as models have them, each wholly on ``openvino:cpu`` against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.backends.openvino.claims import TESTED
from tests.backends.openvino.conftest import DEVICE, model, reference

pytestmark = pytest.mark.usefixtures("ov_cpu")

F, I64 = TensorProto.FLOAT, TensorProto.INT64
BIG = 2**63 - 1


def _ints(name: str, values: list[int]):
    return helper.make_tensor(name, I64, [len(values)], values)


#: id -> (op, inputs after x as constants, attributes, opset, input shape)
CASES = {
    "Reshape": ("Reshape", [[4, -1, 3]], {}, 19, (2, 6, 3)),
    "Reshape-zero": ("Reshape", [[0, 9, 2]], {}, 19, (2, 6, 3)),
    "Slice": ("Slice", [[1, 0], [BIG, -1], [1, 2], [1, 2]], {}, 13, (2, 6, 5)),
    "Slice-negative-step": ("Slice", [[-1], [-BIG], [1], [-2]], {}, 13, (2, 6, 5)),
    "Squeeze": ("Squeeze", [[1]], {}, 13, (2, 1, 5)),
    "Unsqueeze": ("Unsqueeze", [[0, 3]], {}, 13, (2, 6, 5)),
    "Pad-constant": ("Pad", [[0, 1, 2, 0, 2, 1]], {"mode": "constant"}, 13, (2, 6, 5)),
    "Pad-reflect": ("Pad", [[0, 1, 2, 0, 2, 1]], {"mode": "reflect"}, 13, (2, 6, 5)),
    "Expand": ("Expand", [[3, 2, 6, 5]], {}, 13, (2, 1, 5)),
    "Tile": ("Tile", [[2, 1, 3]], {}, 13, (2, 6, 5)),
    "TopK": ("TopK", [[3]], {"axis": -1, "largest": 1}, 11, (2, 6, 5)),
    "Trilu": ("Trilu", [[1]], {"upper": 0}, 14, (2, 6, 5)),
    "ConstantOfShape": ("ConstantOfShape", None, {}, 20, None),
}
for reduce in ("ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceLogSum"):
    CASES[reduce] = (reduce, [[1, -1]], {"keepdims": 1}, 18, (2, 6, 5))
CASES["ReduceLogSumExp"] = ("ReduceLogSumExp", [[2]], {"keepdims": 0}, 18, (2, 6, 5))
CASES["ReduceSumSquare"] = ("ReduceSumSquare", [[0]], {"keepdims": 0}, 18, (2, 6, 5))
CASES["ReduceSum-noop"] = ("ReduceSum", [[]], {"noop_with_empty_axes": 1}, 18, (2, 6, 5))


def _case_model(op, consts, attrs, opset, shape):
    n = helper.make_node
    if op == "ConstantOfShape":
        # a shape computed in the graph (bounded: from Shape), then filled
        value = helper.make_tensor("value", F, [1], [0.5])
        nodes = [n("Shape", ["x"], ["s"]), n("ConstantOfShape", ["s"], ["c"], value=value)]
        nodes.append(n("Add", ["c", "x"], ["y"]))
        return model(nodes, [("x", F, [2, 3])], [("y", F, None)], opset=opset), (2, 3)
    names = [f"k{i}" for i in range(len(consts))]
    inits = [_ints(nm, v) for nm, v in zip(names, consts)]
    outs = ["y", "idx"] if op == "TopK" else ["y"]
    nodes = [n(op, ["x", *names], outs, **attrs)]
    outputs = [("y", F, None)] + ([("idx", I64, None)] if op == "TopK" else [])
    return model(nodes, [("x", F, list(shape))], outputs, inits, opset=opset), shape


def test_every_tested_op_has_a_case():
    assert {c[0] for c in CASES.values()} == set(TESTED)


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_with_constant_int64_inputs(case):
    m, shape = _case_model(*CASES[case])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    sess = anychip.load(m, devices=[DEVICE], strict=True)
    got = sess.run(None, {"x": x})
    ref = reference(m, {"x": x})
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    assert set(sess.placement().by_device()) == {DEVICE}
