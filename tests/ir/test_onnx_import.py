"""``import_model``: content of the imported IR, and every refusal path."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from anychip.errors import GraphError, ModelError, UnsupportedOpError
from anychip.ir import AttrType, DType, Graph, import_model
from anychip.opsets.schemas import SchemaRegistry

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _model(nodes, inputs, outputs, inits=(), opset=21, **kw) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    imports = [h.make_opsetid("", opset)] + kw.pop("extra_imports", [])
    return h.make_model(graph, opset_imports=imports, **kw)


def _vi(name, dtype=TP.FLOAT, shape=(2,)):
    return h.make_tensor_value_info(name, dtype, shape)


def _relu_model() -> onnx.ModelProto:
    return _model([h.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y")])


# -- content ---------------------------------------------------------------------------------
def test_light_model_content() -> None:
    path = os.path.join(LIGHT, "light_squeezenet.onnx")
    proto = onnx.load(path)
    model = import_model(path)
    g = model.graph
    assert model.path == os.path.abspath(path)
    assert model.opset_imports == {"": 9}
    assert model.ir_version == proto.ir_version
    assert model.producer_name == proto.producer_name
    assert len(g.nodes) == len(proto.graph.node)
    assert [n.op_type for n in g.nodes] == [n.op_type for n in proto.graph.node]
    assert all(n.version == 9 for n in g.nodes)
    assert set(g.initializers) == {t.name for t in proto.graph.initializer}
    # Initializers listed as inputs keep the initializer Value: a feed overrides it.
    for v in g.inputs:
        if v.name in g.initializers:
            assert v is g.initializers[v.name] and v.is_const
    t = proto.graph.initializer[0]
    np.testing.assert_array_equal(g.initializers[t.name].const, nh.to_array(t))
    # Shape inference filled intermediate values.
    conv = next(n for n in g.nodes if n.op_type == "Conv")
    assert conv.outputs[0].dtype == DType.FLOAT
    assert conv.outputs[0].is_static and conv.outputs[0].rank == 4
    assert g.outputs[0].shape == (1, 1000, 1, 1)
    # Node names are unique, generated where the file has none.
    names = [n.name for n in g.nodes]
    assert len(set(names)) == len(names) and all(names)
    g.verify()


def test_metadata_doc_and_opset_domain_normalised() -> None:
    proto = _model(
        [h.make_node("Relu", ["x"], ["y"], doc_string="why")],
        [_vi("x")],
        [_vi("y")],
        producer_name="me",
        producer_version="1.2",
        doc_string="a doc",
        extra_imports=[h.make_opsetid("ai.onnx.ml", 3)],
    )
    proto.opset_import[0].domain = "ai.onnx"
    h.set_model_props(proto, {"author": "x", "license": "y"})
    m = import_model(proto)
    assert m.opset_imports == {"": 21, "ai.onnx.ml": 3}
    assert (m.producer_name, m.producer_version, m.doc) == ("me", "1.2", "a doc")
    assert m.metadata == {"author": "x", "license": "y"}
    assert m.graph.nodes[0].doc == "why"
    assert m.path is None


def test_bytes_source_and_proto_not_modified(tmp_path) -> None:
    proto = _relu_model()
    before = proto.SerializeToString()
    a = import_model(proto)
    b = import_model(before)
    assert proto.SerializeToString() == before
    assert str(a.graph) == str(b.graph)


def test_symbolic_and_unknown_dims() -> None:
    x = h.make_tensor_value_info("x", TP.FLOAT, ["batch", None, 3])
    m = import_model(
        _model(
            [h.make_node("Relu", ["x"], ["y"])],
            [x],
            [h.make_tensor_value_info("y", TP.FLOAT, ["batch", None, 3])],
        )
    )
    assert m.graph.inputs[0].shape == ("batch", None, 3)
    assert m.graph.outputs[0].dtype == DType.FLOAT
    assert m.graph.outputs[0].shape == ("batch", None, 3)


def test_shape_inference_fills_intermediate_values() -> None:
    nodes = [
        h.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
        h.make_node("Shape", ["t"], ["s"]),
        h.make_node("Reshape", ["x", "s"], ["y"]),
    ]
    m = import_model(_model(nodes, [_vi("x", shape=("n", 3))], [_vi("y", shape=(3, "n"))]))
    t, s, _ = (n.outputs[0] for n in m.graph.nodes)
    assert (t.dtype, t.shape) == (DType.FLOAT, (3, "n"))
    assert (s.dtype, s.shape) == (DType.INT64, (2,))


def test_attributes_become_python_values() -> None:
    t = nh.from_array(np.arange(6, dtype=np.int64).reshape(2, 3))
    nodes = [
        h.make_node("Constant", [], ["c"], value=t),
        h.make_node("Transpose", ["c"], ["ct"], perm=[1, 0]),
        h.make_node("LeakyRelu", ["x"], ["y"], alpha=0.25),
        h.make_node("Cast", ["ct"], ["s"], to=TP.STRING),
        h.make_node(
            "StringNormalizer", ["s2"], ["s3"], stopwords=["a", "b"], case_change_action="LOWER"
        ),
    ]
    s2 = h.make_tensor_value_info("s2", TP.STRING, [2])
    m = import_model(
        _model(
            nodes,
            [_vi("x"), s2],
            [
                _vi("y"),
                h.make_tensor_value_info("ct", TP.INT64, [3, 2]),
                h.make_tensor_value_info("s", TP.STRING, [3, 2]),
                h.make_tensor_value_info("s3", TP.STRING, [2]),
            ],
        )
    )
    const, tr, leaky, cast, norm = m.graph.nodes
    assert const.op_type == "Constant"  # kept as a node; a pass folds it
    assert const.attributes["value"].type == AttrType.TENSOR
    np.testing.assert_array_equal(const.attr("value"), np.arange(6).reshape(2, 3))
    assert tr.attributes["perm"].type == AttrType.INTS and tr.attr("perm") == [1, 0]
    assert leaky.attributes["alpha"].type == AttrType.FLOAT and leaky.attr("alpha") == 0.25
    assert cast.attributes["to"].type == AttrType.INT and cast.attr("to") == TP.STRING
    assert norm.attr("stopwords") == ["a", "b"] and norm.attr("case_change_action") == "LOWER"
    assert tr.outputs[0].shape == (3, 2)


def test_empty_names_become_none() -> None:
    # Dropout with an omitted optional input and a skipped mask output; Clip with "" min.
    nodes = [h.make_node("Clip", ["x", "", "hi"], ["c"]), h.make_node("Dropout", ["c"], ["y", ""])]
    hi = nh.from_array(np.array(1.0, np.float32), "hi")
    m = import_model(_model(nodes, [_vi("x")], [_vi("y")], [hi]))
    clip, drop = m.graph.nodes
    assert clip.inputs[1] is None and clip.inputs[2] is m.graph.initializers["hi"]
    assert len(drop.outputs) == 2 and drop.outputs[0] is not None and drop.outputs[1] is None


def test_low_precision_initializers() -> None:
    bf = np.array([1.5, -2.0, 0.25], dtype=ml_dtypes.bfloat16)
    f8 = np.array([1.0, 0.5, -4.0], dtype=ml_dtypes.float8_e4m3fn)
    i4 = np.array([-3, 0, 7], dtype=ml_dtypes.int4)
    inits = [nh.from_array(bf, "bf"), nh.from_array(f8, "f8"), nh.from_array(i4, "i4")]
    nodes = [h.make_node("Cast", [n], [n + "_f"], to=TP.FLOAT) for n in ("bf", "f8", "i4")]
    outs = [_vi(n + "_f", shape=(3,)) for n in ("bf", "f8", "i4")]
    m = import_model(_model(nodes, [], outs, inits))
    for name, want, dtype in (
        ("bf", bf, DType.BFLOAT16),
        ("f8", f8, DType.FLOAT8E4M3FN),
        ("i4", i4, DType.INT4),
    ):
        v = m.graph.initializers[name]
        assert v.dtype == dtype and v.const.dtype == dtype.numpy
        np.testing.assert_array_equal(v.const.astype(np.float32), want.astype(np.float32))


def test_string_initializer_is_object_array_of_str() -> None:
    s = h.make_tensor("s", TP.STRING, [2], [b"ab", "\u00e9".encode()])
    m = import_model(
        _model(
            [h.make_node("Identity", ["s"], ["y"])],
            [],
            [h.make_tensor_value_info("y", TP.STRING, [2])],
            [s],
        )
    )
    v = m.graph.initializers["s"]
    assert v.dtype == DType.STRING and v.const.dtype == object
    assert v.const.tolist() == ["ab", "\u00e9"]


def test_sparse_initializer_and_sparse_constant_are_densified() -> None:
    values = nh.from_array(np.array([5.0, 7.0], np.float32), "sp")
    indices = nh.from_array(np.array([1, 4], np.int64), "sp_idx")
    sparse = h.make_sparse_tensor(values, indices, [2, 3])
    values2 = nh.from_array(np.array([3.0], np.float32), "c_vals")
    indices2 = nh.from_array(np.array([[0, 2]], np.int64), "c_idx")  # coordinate form
    sparse2 = h.make_sparse_tensor(values2, indices2, [2, 3])
    graph = h.make_graph(
        [
            h.make_node("Constant", [], ["c"], sparse_value=sparse2),
            h.make_node("Add", ["sp", "c"], ["y"]),
        ],
        "g",
        [],
        [_vi("y", shape=(2, 3))],
        sparse_initializer=[sparse],
    )
    m = import_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 21)]))
    dense = np.zeros((2, 3), np.float32)
    dense.flat[[1, 4]] = [5.0, 7.0]
    np.testing.assert_array_equal(m.graph.initializers["sp"].const, dense)
    const = m.graph.nodes[0]
    assert "sparse_value" not in const.attributes
    want = np.zeros((2, 3), np.float32)
    want[0, 2] = 3.0
    np.testing.assert_array_equal(const.attr("value"), want)


def test_sequence_values_keep_their_type_proto() -> None:
    nodes = [
        h.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
        h.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0),
    ]
    m = import_model(_model(nodes, [_vi("x")], [_vi("y", shape=(4,))]))
    seq = m.graph.nodes[0].outputs[0]
    assert not seq.is_tensor
    assert seq.type_proto.WhichOneof("value") == "sequence_type"
    assert seq.dtype == DType.FLOAT
    assert seq.type_str().startswith("seq(f32")


def _if_model() -> onnx.ModelProto:
    """y = If(c) then Relu(x + b) else Neg(x); both branches capture outer values."""
    then = h.make_graph([h.make_node("Relu", ["xb"], ["t"])], "then", [], [_vi("t")])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e")])
    nodes = [
        h.make_node("Add", ["x", "b"], ["xb"]),
        h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    b = nh.from_array(np.array([1.0, -3.0], np.float32), "b")
    return _model(nodes, [h.make_tensor_value_info("c", TP.BOOL, []), _vi("x")], [_vi("y")], [b])


def test_nested_graph_captures_outer_value_objects() -> None:
    m = import_model(_if_model())
    add, if_node = m.graph.nodes
    then, other = if_node.attr("then_branch"), if_node.attr("else_branch")
    assert isinstance(then, Graph) and then.parent is if_node
    assert if_node.attributes["then_branch"].type == AttrType.GRAPH
    xb = add.outputs[0]
    assert then.nodes[0].inputs[0] is xb  # the same Value object, not a copy
    assert other.nodes[0].inputs[0] is m.graph.inputs[1]
    assert (then.nodes[0], 0) in xb.uses
    m.graph.verify()


def test_loop_body_has_its_own_formal_inputs() -> None:
    body = h.make_graph(
        [
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
            h.make_node("Add", ["acc_in", "step"], ["acc_out"]),
        ],
        "body",
        [
            h.make_tensor_value_info("i", TP.INT64, []),
            h.make_tensor_value_info("cond_in", TP.BOOL, []),
            _vi("acc_in"),
        ],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), _vi("acc_out")],
    )
    step = nh.from_array(np.array([1.0, 2.0], np.float32), "step")
    n = nh.from_array(np.array(3, np.int64), "n")
    m = import_model(
        _model(
            [h.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
            [_vi("x")],
            [_vi("y")],
            [step, n],
        )
    )
    loop = m.graph.nodes[0]
    g = loop.attr("body")
    assert [v.name for v in g.inputs] == ["i", "cond_in", "acc_in"]
    assert all(v.producer is None and not v.is_const for v in g.inputs)
    assert g.nodes[1].inputs[1] is m.graph.initializers["step"]
    assert loop.inputs[1] is None


def test_model_local_function_is_inlined() -> None:
    fn = h.make_function(
        "local",
        "AddRelu",
        ["a", "b"],
        ["out"],
        [h.make_node("Add", ["a", "b"], ["s"]), h.make_node("Relu", ["s"], ["out"])],
        opset_imports=[h.make_opsetid("", 21)],
    )
    proto = _model(
        [h.make_node("AddRelu", ["x", "x"], ["y"], domain="local")],
        [_vi("x")],
        [_vi("y")],
        functions=[fn],
        extra_imports=[h.make_opsetid("local", 1)],
    )
    m = import_model(proto)
    assert [n.op_type for n in m.graph.nodes] == ["Add", "Relu"]
    assert all(n.domain == "" for n in m.graph.nodes)
    assert m.graph.nodes[1].outputs[0] is m.graph.outputs[0]


def test_unsorted_graph_is_sorted() -> None:
    nodes = [
        h.make_node("Neg", ["a"], ["y"], name="second"),
        h.make_node("Relu", ["x"], ["a"], name="first"),
    ]
    m = import_model(_model(nodes, [_vi("x")], [_vi("y")]))
    assert [n.name for n in m.graph.nodes] == ["first", "second"]
    m.graph.verify()


def test_cycle_is_refused() -> None:
    nodes = [h.make_node("Add", ["x", "b"], ["a"]), h.make_node("Neg", ["a"], ["b"])]
    with pytest.raises((ModelError, GraphError), match="cycle"):
        import_model(_model(nodes, [_vi("x")], [_vi("b")]))


def test_custom_domain_accepted_with_schemas() -> None:
    schema = onnx.defs.OpSchema(
        "Boost",
        "com.vendor",
        1,
        inputs=[onnx.defs.OpSchema.FormalParameter("x", "T")],
        outputs=[onnx.defs.OpSchema.FormalParameter("y", "T")],
        type_constraints=[("T", ["tensor(float)"], "")],
    )
    reg = SchemaRegistry()
    reg.add(schema)
    proto = _model(
        [h.make_node("Boost", ["x"], ["y"], domain="com.vendor")],
        [_vi("x")],
        [_vi("y")],
        extra_imports=[h.make_opsetid("com.vendor", 1)],
    )
    m = import_model(proto, custom_schemas=reg)
    node = m.graph.nodes[0]
    assert (node.domain, node.version) == ("com.vendor", 1)
    # Without the import of the domain the checker complains; a plugin domain is forgiven.
    del proto.opset_import[1]
    m = import_model(proto, custom_schemas=reg)
    assert m.graph.nodes[0].domain == "com.vendor"


# -- refusals --------------------------------------------------------------------------------
def test_missing_file(tmp_path) -> None:
    with pytest.raises(ModelError, match="not found"):
        import_model(tmp_path / "nope.onnx")


def test_truncated_file(tmp_path) -> None:
    data = open(os.path.join(LIGHT, "light_squeezenet.onnx"), "rb").read()
    path = tmp_path / "half.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="truncated or not an ONNX model") as err:
        import_model(path)
    assert str(path) in str(err.value) and str(len(data) // 2) in str(err.value)


@pytest.mark.parametrize("garbage", [b"\xff\xfe not a model at all", b"hello world", b""])
def test_garbage_bytes(garbage, tmp_path) -> None:
    with pytest.raises(ModelError, match="truncated or not an ONNX model"):
        import_model(garbage)
    path = tmp_path / "g.onnx"
    path.write_bytes(garbage)
    with pytest.raises(ModelError, match="truncated or not an ONNX model"):
        import_model(path)


def test_checker_failure_is_reported() -> None:
    # Relu given two inputs: the checker refuses the node.
    proto = _model([h.make_node("Relu", ["x", "x"], ["y"])], [_vi("x")], [_vi("y")])
    with pytest.raises(ModelError, match="onnx.checker"):
        import_model(proto)


def test_unknown_domain_names_node_op_and_domain() -> None:
    proto = _model(
        [h.make_node("Frob", ["x"], ["y"], domain="com.nobody", name="frob1")],
        [_vi("x")],
        [_vi("y")],
        extra_imports=[h.make_opsetid("com.nobody", 1)],
    )
    with pytest.raises(UnsupportedOpError, match="frob1") as err:
        import_model(proto)
    assert "Frob" in str(err.value) and "com.nobody" in str(err.value)


def test_unknown_domain_inside_a_subgraph() -> None:
    then = h.make_graph(
        [h.make_node("Frob", ["x"], ["t"], domain="com.nobody")], "then", [], [_vi("t")]
    )
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e")])
    proto = _model(
        [h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [h.make_tensor_value_info("c", TP.BOOL, []), _vi("x")],
        [_vi("y")],
        extra_imports=[h.make_opsetid("com.nobody", 1)],
    )
    with pytest.raises(UnsupportedOpError, match="com.nobody"):
        import_model(proto)


def _external_model(folder) -> str:
    w = nh.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "w")
    proto = _model(
        [h.make_node("MatMul", ["x", "w"], ["y"])],
        [_vi("x", shape=(1, 4))],
        [_vi("y", shape=(1, 4))],
        [w],
    )
    onnx.external_data_helper.convert_model_to_external_data(
        proto, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0
    )
    path = os.path.join(folder, "model.onnx")
    onnx.save_model(proto, path)
    return path


def _set_location(path: str, location: str) -> None:
    proto = onnx.load(path, load_external_data=False)
    for entry in proto.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save_model(proto, path)


def test_external_data_is_loaded(tmp_path) -> None:
    path = _external_model(tmp_path)
    m = import_model(path)
    np.testing.assert_array_equal(
        m.graph.initializers["w"].const, np.arange(16, dtype=np.float32).reshape(4, 4)
    )
    # Bytes need base_dir to find the file.
    data = open(path, "rb").read()
    with pytest.raises(ModelError, match="base_dir"):
        import_model(data)
    m = import_model(data, base_dir=tmp_path)
    assert m.graph.initializers["w"].const.shape == (4, 4)


def test_external_data_escaping_with_dotdot(tmp_path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    path = _external_model(folder)
    os.replace(folder / "weights.bin", tmp_path / "x.bin")  # exists, but outside
    _set_location(path, "../x.bin")
    with pytest.raises(ModelError, match="outside") as err:
        import_model(path)
    assert "'w'" in str(err.value) and "../x.bin" in str(err.value)


def test_external_data_absolute_location(tmp_path) -> None:
    path = _external_model(tmp_path)
    absolute = str(tmp_path / "weights.bin")
    _set_location(path, absolute)
    with pytest.raises(ModelError, match="absolute") as err:
        import_model(path)
    assert "'w'" in str(err.value) and absolute in str(err.value)


def test_external_data_symlink_out_of_folder(tmp_path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    path = _external_model(folder)
    os.replace(folder / "weights.bin", tmp_path / "secret.bin")
    os.symlink(tmp_path / "secret.bin", folder / "weights.bin")
    with pytest.raises(ModelError, match="outside"):
        import_model(path)


def test_external_data_missing_file(tmp_path) -> None:
    path = _external_model(tmp_path)
    os.remove(tmp_path / "weights.bin")
    with pytest.raises(ModelError, match="not found"):
        import_model(path)


def test_external_data_truncated_file(tmp_path) -> None:
    path = _external_model(tmp_path)
    with open(tmp_path / "weights.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(ModelError, match="truncated"):
        import_model(path)
