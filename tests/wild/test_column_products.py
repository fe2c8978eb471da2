"""skl2onnx's PolynomialFeatures (one ArrayFeatureExtractor and one ReduceProd per output
feature, all into a Concat) runs as one ``anychip::ColumnProducts`` node, with onnxruntime's
results; the fusion leaves alone products whose intermediates are read elsewhere."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from tests.backends.cpu._fusion_models import ops
from tests.wild._compare import anychip_run, ort_run


@pytest.mark.parametrize(
    "degree, interaction_only, dtype",
    # (float64: skl2onnx's model mixes a float column of ones into the Concat: invalid)
    [(2, False, np.float32), (3, True, np.float32), (3, False, np.float32)],
)
def test_polynomial_features_fused_and_equal_to_onnxruntime(degree, interaction_only, dtype):
    from skl2onnx import to_onnx  # imported here, not at collection (1-2 s per xdist worker)
    from sklearn.preprocessing import PolynomialFeatures

    rng = np.random.default_rng(degree)
    x = rng.standard_normal((50, 6)).astype(dtype)
    poly = PolynomialFeatures(degree, interaction_only=interaction_only).fit(x)
    model = to_onnx(poly, x[:1], target_opset={"": 17, "ai.onnx.ml": 1})
    kinds = ops(model)
    # The last product is also read by the Shape that sizes the column of ones: it stays.
    assert kinds.count("ColumnProducts") == 1 and kinds.count("ReduceProd") == 1, kinds
    assert len(kinds) == 6, kinds
    got, _ = anychip_run(model, {"X": x})
    np.testing.assert_allclose(got[0], ort_run(model, {"X": x})[0], rtol=1e-6, atol=0)
    np.testing.assert_allclose(got[0], poly.transform(x), rtol=1e-5, atol=1e-6)
    unfused = ops(model, disabled_passes=["fuse_column_products"])
    assert "ColumnProducts" not in unfused and "ReduceProd" in unfused


def _products(read_elsewhere: bool) -> onnx.ModelProto:
    nodes, outs = [], []
    for i in range(4):
        nodes.append(
            h.make_node("ArrayFeatureExtractor", ["X", f"c{i}"], [f"g{i}"], domain="ai.onnx.ml")
        )
        nodes.append(h.make_node("ReduceProd", [f"g{i}"], [f"p{i}"], axes=[1]))
        outs.append(f"p{i}")
    nodes.append(h.make_node("Concat", ["X", *outs], ["Y"], axis=1))
    graph_outs = [h.make_tensor_value_info("Y", T.FLOAT, None)]
    if read_elsewhere:  # one gather is also a graph output: that product must stay
        graph_outs.append(h.make_tensor_value_info("g1", T.FLOAT, None))
    inits = [
        nh.from_array(np.array(c, np.int64), f"c{i}")
        for i, c in enumerate([[0, 1], [2], [1, 1], [3, 0, 2]])
    ]
    g = h.make_graph(
        nodes, "g", [h.make_tensor_value_info("X", T.FLOAT, [None, 4])], graph_outs, inits
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 1)])


@pytest.mark.parametrize("read_elsewhere", [False, True])
def test_only_runs_of_products_read_once_are_fused(read_elsewhere: bool) -> None:
    x = np.random.default_rng(1).standard_normal((7, 4)).astype(np.float32)
    model = _products(read_elsewhere)
    kinds = ops(model)
    # With g1 read elsewhere the run splits: [p0] and [p2, p3] are under MIN_RUN.
    assert kinds.count("ColumnProducts") == (0 if read_elsewhere else 1), kinds
    assert kinds.count("ReduceProd") == (4 if read_elsewhere else 0), kinds
    got, _ = anychip_run(model, {"X": x})
    for g, w in zip(got, ort_run(model, {"X": x})):
        np.testing.assert_array_equal(g, w)
