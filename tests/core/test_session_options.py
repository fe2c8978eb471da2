"""``SessionOptions``: one object for load's settings; the keywords are a convenience over it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import anychip


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], rng.standard_normal(16).tolist())
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [w],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_options_object_and_keywords_place_alike():
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    opts = anychip.SessionOptions(placement={"Relu": "cpu"}, strict=False)
    a = anychip.load(_model(), ["xpu", "cpu"], options=opts)
    b = anychip.load(_model(), ["xpu", "cpu"], placement={"Relu": "cpu"})
    assert a.placement().by_device() == b.placement().by_device()
    np.testing.assert_allclose(a.run(None, {"x": x})[0], b.run(None, {"x": x})[0], rtol=1e-6)


def test_keywords_override_the_options_object_without_changing_it():
    opts = anychip.SessionOptions(placement={"MatMul": "xpu"})
    sess = anychip.load(_model(), ["xpu", "cpu"], options=opts, placement={"*": "cpu"})
    assert set(sess.placement().by_device()) == {"cpu"}
    assert opts.placement == {"MatMul": "xpu"}


def test_unknown_keyword_names_it_and_the_known_ones():
    with pytest.raises(anychip.AnychipError, match=r"unknown load option.*'stirct'.*strict"):
        anychip.load(_model(), ["cpu"], stirct=True)


def test_bad_values_and_kinds_are_refused():
    with pytest.raises(anychip.AnychipError, match="plan_cache_size"):
        anychip.SessionOptions(plan_cache_size=0)
    with pytest.raises(anychip.AnychipError, match="must be an anychip.SessionOptions"):
        anychip.load(_model(), ["cpu"], options={"strict": True})
