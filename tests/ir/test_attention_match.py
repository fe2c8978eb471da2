"""ir.passes.attention.match_attention: the one matcher of the attention chain that the fusion
passes rewrite and the cost model prices (core/plan/cost_patterns.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from anychip.ir.onnx import import_model
from anychip.ir.passes.attention import match_attention


def _model(scale: np.ndarray, mask_type: int = TensorProto.FLOAT) -> bytes:
    n = helper.make_node
    nodes = [
        n("MatMul", ["q", "kt"], ["s"], name="qk"),
        n("Div", ["s", "c"], ["sc"], name="scale"),
        n("Add", ["sc", "mask"], ["sm"], name="mask_add"),
        n("Softmax", ["sm"], ["p"], name="softmax", axis=-1),
        n("MatMul", ["p", "v"], ["y"], name="pv"),
    ]
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("q", f, [2, 8, 16]),
        helper.make_tensor_value_info("kt", f, [2, 16, 8]),
        helper.make_tensor_value_info("mask", mask_type, [2, 8, 8]),
        helper.make_tensor_value_info("v", f, [2, 8, 16]),
    ]
    g = helper.make_graph(
        nodes,
        "attn",
        inputs,
        [helper.make_tensor_value_info("y", f, [2, 8, 16])],
        [numpy_helper.from_array(scale, "c")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _match(model: bytes):
    g = import_model(model).graph
    return match_attention(next(n for n in g.nodes if n.name == "qk"), g)


def test_the_chain_its_scale_and_mask():
    m = _match(_model(np.array(4.0, np.float32)))
    assert [n.name for n in m.nodes] == ["qk", "scale", "mask_add", "softmax", "pv"]
    assert m.scale == 4.0 and m.divide and m.mask.name == "mask"


@pytest.mark.parametrize(
    "scale, mask_type",
    [
        (np.array(4, np.int64), TensorProto.FLOAT),  # not a float constant
        (np.array([4.0, 2.0], np.float32), TensorProto.FLOAT),  # not one element
        (np.array(4.0, np.float32), TensorProto.DOUBLE),  # a mask of another dtype
    ],
)
def test_what_is_not_the_chain(scale, mask_type):
    assert _match(_model(scale, mask_type)) is None
