"""The code generator's front half: the expression text form, the ONNX lowering, the
broadcast classes."""

from __future__ import annotations

import math

import pytest

from anychip.codegen.expr import call, const, inp, parse
from anychip.codegen.onnx_ops import lower
from anychip.codegen.program import classify, linearize
from anychip.errors import AnychipError


@pytest.mark.parametrize(
    "text",
    [
        "mul(in0,sigmoid(in0))",
        "select(ge(in0,0.0),in0,mul(in0,0.01))",
        "max(min(add(in1,-2.5e-07),nan),inf)",
        "pow(in3,-inf)",
    ],
)
def test_text_round_trip(text):
    e = parse(text)
    assert str(e) == text
    assert parse(str(e)) == e


@pytest.mark.parametrize(
    "bad", ["mul(in0)", "frob(in0)", "add(in0,in1", "add(in0,in1))", "add(in0;in1)", ""]
)
def test_bad_text_is_a_clear_error(bad):
    with pytest.raises(AnychipError, match="expression"):
        parse(bad)


def test_shared_subexpressions_are_computed_once():
    x = call("add", inp(0), inp(1))
    steps = linearize(call("mul", x, call("sigmoid", x)))
    assert [s.op for s in steps] == ["in", "in", "add", "sigmoid", "mul"]
    assert call("mul", x, x).inputs() == {0, 1}


def test_lowering_keeps_the_kernels_formulas():
    x = inp(0)
    assert str(lower("Relu", [x], {})) == "max(in0,0.0)"
    assert str(lower("LeakyRelu", [x], {"alpha": 0.5})) == "select(ge(in0,0.0),in0,mul(in0,0.5))"
    assert str(lower("Pow", [x, const(2.0)], {})) == "mul(in0,in0)"
    assert str(lower("Pow", [x, const(3.0)], {})) == "mul(mul(in0,in0),in0)"
    assert str(lower("Clip", [x, None, const(6.0)], {})) == "min(in0,6.0)"
    assert str(lower("Clip", [x], {"min": -1.0})) == "max(in0,-1.0)"
    assert str(lower("Max", [x, inp(1), inp(2)], {})) == "max(max(in0,in1),in2)"
    gelu = str(lower("Gelu", [x], {}))
    assert "erf" in gelu and repr(1 / math.sqrt(2)) in gelu
    assert "tanh" in str(lower("Gelu", [x], {"approximate": "tanh"}))


def test_lowering_refuses_what_it_cannot_express():
    assert lower("Pow", [inp(0), inp(1)], {}) is None  # exponent not constant
    assert lower("Clip", [inp(0), inp(1), None], {}) is None  # bound not constant
    assert lower("Gelu", [inp(0)], {"approximate": "erf"}) is None
    assert lower("Softmax", [inp(0)], {}) is None


@pytest.mark.parametrize(
    "shapes, out, classes, outer",
    [
        ([(2, 3, 4)], (2, 3, 4), ("F",), 1),
        ([(2, 3, 4, 5), (3, 1, 1), ()], (2, 3, 4, 5), ("F", "R", "S"), 6),
        ([(2, 7, 8), (8,)], (2, 7, 8), ("F", "I"), 14),
        ([(4, 5), (4, 1)], (4, 5), ("F", "R"), 4),
        ([(3, 1), (1, 4)], (3, 4), ("R", "I"), 3),
        ([(2, 3, 4), (2, 1, 4)], (2, 3, 4), ("F", "X"), 1),
    ],
)
def test_broadcast_classes(shapes, out, classes, outer):
    layout = classify(shapes, out)
    assert layout.classes == classes
    assert layout.outer == outer and layout.outer * layout.inner == math.prod(out)
