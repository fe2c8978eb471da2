"""A Cast to its input's own type (skl2onnx's first node on a float input) is removed on the
CPU: its readers read the input; kept where its output is a graph output."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from tests.backends.cpu._fusion_models import ops
from tests.wild._compare import anychip_run, ort_run


def _model(to: int, cast_is_output: bool) -> onnx.ModelProto:
    nodes = [
        h.make_node("Cast", ["X"], ["c"], to=to),
        h.make_node("MatMul", ["c", "W"], ["Y"]),
    ]
    outs = [h.make_tensor_value_info("Y", to, None)]
    if cast_is_output:
        outs.append(h.make_tensor_value_info("c", to, None))
    w = (
        np.random.default_rng(to)
        .standard_normal((5, 3))
        .astype(onnx.helper.tensor_dtype_to_np_dtype(to))
    )
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("X", T.FLOAT, [None, 5])],
        outs,
        [nh.from_array(w, "W")],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "to, cast_is_output, kept",
    [(T.FLOAT, False, False), (T.FLOAT, True, True), (T.DOUBLE, False, True)],
)
def test_same_type_cast_removed_only_where_it_only_copies(to, cast_is_output, kept) -> None:
    model = _model(to, cast_is_output)
    assert ("Cast" in ops(model)) == kept
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    got, _ = anychip_run(model, {"X": x})
    for g, w in zip(got, ort_run(model, {"X": x})):
        np.testing.assert_array_equal(g, w)
    if cast_is_output:  # the output is its own array, not the feed
        assert got[1] is not x
