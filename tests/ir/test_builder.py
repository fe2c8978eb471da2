"""``GraphBuilder``: graphs written in Python, exported, and run by onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from anychip.errors import GraphError
from anychip.ir import Attr, AttrType, DType, GraphBuilder, Model, export_model, import_model


def _run(model: Model, feeds: dict) -> list[np.ndarray]:
    proto = export_model(model)
    onnx.checker.check_model(proto, full_check=True)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_gemm_relu_builds_infers_and_runs() -> None:
    b = GraphBuilder(opset=21)
    x = b.input("x", DType.FLOAT, [1, "n"])
    w = b.constant(np.arange(9, dtype=np.float32).reshape(3, 3) - 4, name="w")
    y = b.op("Gemm", x, w, transB=1)
    z = b.Relu(y)
    b.output(z, "z")
    model = b.build()
    g = model.graph
    assert model.opset_imports == {"": 21}
    assert w.is_const and g.initializers["w"] is w
    assert [n.op_type for n in g.nodes] == ["Gemm", "Relu"]
    assert g.outputs[0] is z and z.name == "z"
    assert g.nodes[0].attributes["transB"].type == AttrType.INT
    # Shape inference filled what the builder did not know; the declared input stays.
    assert (y.dtype, y.shape) == (DType.FLOAT, (1, 3))
    assert g.inputs[0].shape == (1, "n")
    x_val = np.array([[1.0, -2.0, 3.0]], np.float32)
    (got,) = _run(model, {"x": x_val})
    np.testing.assert_allclose(got, np.maximum(x_val @ w.const.T, 0), rtol=1e-6)


def test_automatic_names_are_unique() -> None:
    b = GraphBuilder()
    x = b.input("x", DType.FLOAT, [2])
    values = [b.Relu(x) for _ in range(3)]
    values.append(b.op("Relu", x))
    assert len({v.name for v in values}) == 4
    assert len({n.name for n in b.graph.nodes}) == 4
    assert values[0].name == "relu_0" and b.graph.nodes[0].name == "Relu_0"


def test_user_names_are_checked() -> None:
    b = GraphBuilder()
    x = b.input("x", DType.FLOAT, [2])
    with pytest.raises(GraphError, match="'x' is already used"):
        b.input("x", DType.FLOAT, [2])
    b.op("Relu", x, name="r")
    with pytest.raises(GraphError, match="'r' is already used"):
        b.op("Neg", x, name="r")
    # An automatic name steps around one the user took.
    b.constant(np.zeros(1, np.float32), name="const_0")
    assert b.constant(np.zeros(1, np.float32)).name == "const_1"


def test_multiple_outputs() -> None:
    b = GraphBuilder()
    x = b.input("x", DType.FLOAT, [4])
    split = np.array([1, 3], np.int64)
    a, c = b.Split(x, split, outputs=2)
    d, e = b.op("Split", x, split, outputs=["first", "rest"])
    assert (d.name, e.name) == ("first", "rest")
    for v in (a, c, d, e):
        b.output(v)
    model = b.build()
    assert c.shape == (3,) and a.producer is c.producer
    got = _run(model, {"x": np.arange(4, dtype=np.float32)})
    assert [r.tolist() for r in got] == [[0.0], [1.0, 2.0, 3.0]] * 2


def test_attribute_types_from_python_and_schema() -> None:
    b = GraphBuilder()
    x = b.input("x", DType.FLOAT, [2, 3])
    leaky = b.LeakyRelu(x, alpha=1)  # an int where the schema wants FLOAT
    t = b.Transpose(x, perm=[1, 0])
    cast = b.Cast(x, to=int(DType.INT64))
    const = b.Constant(value=np.array([1.5], np.float32))
    squeezed = b.ReduceSum(x, keepdims=0)
    node = {v.producer.op_type: v.producer for v in (leaky, t, cast, const, squeezed)}
    assert node["LeakyRelu"].attributes["alpha"].type == AttrType.FLOAT
    assert node["LeakyRelu"].attr("alpha") == 1.0 and isinstance(
        node["LeakyRelu"].attr("alpha"), float
    )
    assert node["Transpose"].attributes["perm"].type == AttrType.INTS
    assert node["Cast"].attributes["to"].type == AttrType.INT
    assert node["Constant"].attributes["value"].type == AttrType.TENSOR
    for v in (leaky, t, cast, const, squeezed):
        b.output(v)
    model = b.build()
    assert (t.shape, cast.dtype, const.shape) == ((3, 2), DType.INT64, (1,))
    x_val = np.array([[-1.0, 2.0, 3.0], [4.0, -5.0, 6.0]], np.float32)
    got = _run(model, {"x": x_val})
    np.testing.assert_array_equal(got[1], x_val.T)
    np.testing.assert_array_equal(got[2], x_val.astype(np.int64))
    assert got[4] == pytest.approx(9.0)


def test_empty_list_takes_the_schema_type() -> None:
    b = GraphBuilder()
    x = b.input("x", DType.FLOAT, [2])
    v = b.op("Concat", x, x, axis=0)
    # An empty list on an op with a list attribute: the schema says INTS.
    t = b.Transpose(v, perm=[])
    assert t.producer.attributes["perm"].type == AttrType.INTS
    assert t.producer.attr("perm") == []
    # No schema (unknown custom op): an empty list cannot be typed, an explicit Attr can.
    with pytest.raises(GraphError, match="empty list"):
        b.op("Mystery", x, domain="com.vendor", sizes=[])
    m = b.op("Mystery", x, domain="com.vendor", sizes=Attr("sizes", AttrType.FLOATS, []))
    assert m.producer.attributes["sizes"].type == AttrType.FLOATS


def test_unknown_attribute_and_bad_input_are_refused() -> None:
    b = GraphBuilder()
    x = b.input("x", DType.FLOAT, [2])
    with pytest.raises(GraphError, match="no attribute 'alpah'"):
        b.LeakyRelu(x, alpah=0.1)
    with pytest.raises(GraphError, match="must be INTS"):
        b.Transpose(x, perm="01")
    with pytest.raises(GraphError, match="ir.Value"):
        b.Relu(3.0)
    with pytest.raises(AttributeError):
        b.relu  # noqa: B018  (lower-case names are not ops)


def test_numpy_inputs_become_initializers_and_custom_domain_is_imported() -> None:
    b = GraphBuilder(opsets={"com.vendor": 3})
    x = b.input("x", DType.FLOAT, [2])
    y = b.Add(x, np.array([1.0, 2.0], np.float32))
    z = b.op("Boost", y, domain="com.vendor", gain=2.0)
    w = b.op("Other", y, domain="org.new")
    b.output(z)
    b.output(w)
    model = b.build()
    assert y.producer.inputs[1].is_const
    assert y.producer.inputs[1].name in model.graph.initializers
    assert model.opset_imports == {"": 21, "com.vendor": 3, "org.new": 1}
    assert z.producer.version == 3 and z.producer.domain == "com.vendor"


def test_output_renames_or_copies() -> None:
    b = GraphBuilder()
    x = b.input("x", DType.FLOAT, [2])
    r = b.Relu(x)
    assert b.output(r, "out") is r and r.name == "out"
    copy = b.output(r)  # the same value twice: an Identity carries the second one
    assert copy is not r and copy.producer.op_type == "Identity"
    passthrough = b.output(x, "x_again")  # a graph input cannot be renamed
    assert passthrough.producer.op_type == "Identity" and passthrough.name == "x_again"
    model = b.build()
    assert [v.name for v in model.graph.outputs] == ["out", copy.name, "x_again"]
    got = _run(model, {"x": np.array([-1.0, 2.0], np.float32)})
    assert [g.tolist() for g in got] == [[0.0, 2.0], [0.0, 2.0], [-1.0, 2.0]]


def test_if_subgraph_with_capture() -> None:
    b = GraphBuilder()
    c = b.input("c", DType.BOOL, [])
    x = b.input("x", DType.FLOAT, [2])
    shift = b.constant(np.array([10.0, 20.0], np.float32), name="shift")
    then = b.subgraph("then")
    then.output(then.Add(x, shift))  # captures x and shift from the outer builder
    other = b.subgraph("else")
    other.output(other.Neg(x))
    y = b.If(c, then_branch=then, else_branch=other)
    b.output(y, "y")
    model = b.build()
    if_node = model.graph.nodes[0]
    assert if_node.attributes["then_branch"].type == AttrType.GRAPH
    assert if_node.attr("then_branch").parent is if_node
    assert if_node.attr("then_branch").nodes[0].inputs[0] is x
    assert y.dtype == DType.FLOAT
    x_val = np.array([1.0, 2.0], np.float32)
    (yes,) = _run(model, {"c": np.array(True), "x": x_val})
    (no,) = _run(model, {"c": np.array(False), "x": x_val})
    assert yes.tolist() == [11.0, 22.0] and no.tolist() == [-1.0, -2.0]
    with pytest.raises(GraphError, match="nested"):
        then.build()


def test_loop_body_built_with_subgraph() -> None:
    b = GraphBuilder()
    n = b.input("n", DType.INT64, [])
    x = b.input("x", DType.FLOAT, [2])
    body = b.subgraph("body")
    body.input("i", DType.INT64, [])
    cond = body.input("cond", DType.BOOL, [])
    acc = body.input("acc", DType.FLOAT, [2])
    body.output(body.Identity(cond))
    body.output(body.Add(acc, x))
    y = b.Loop(n, None, x, body=body)
    # ONNX inference does not give a Loop's carried value a rank; the main graph needs one.
    b.output(y, "y", shape=[2])
    model = b.build()
    assert (y.dtype, y.shape) == (DType.FLOAT, (2,))
    (got,) = _run(model, {"n": np.array(3, np.int64), "x": np.array([1.0, 2.0], np.float32)})
    assert got.tolist() == [4.0, 8.0]
    assert import_model(export_model(model)).graph.nodes[0].attr("body").inputs[2].name == "acc"


def test_build_verifies() -> None:
    b = GraphBuilder()
    x = b.input("x", DType.FLOAT, [2])
    y = b.Relu(x)
    b.graph.nodes[0].inputs[0] = None  # broken behind the builder's back: stale use of x
    b.output(y)
    with pytest.raises(GraphError):
        b.build()
