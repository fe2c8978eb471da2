"""``export_model``: round trips through the IR stay valid ONNX and compute the same outputs."""

from __future__ import annotations

import glob
import os

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from anychip.ir import Attr, AttrType, DType, Value, export_model, import_model
from anychip.opsets.schemas import SchemaRegistry

LIGHT = sorted(
    glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/*.onnx"))
)


def _ort(model: onnx.ModelProto | str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    # No graph optimisation: the point is to compare the graphs as written, and it is faster.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _round_trip(proto: onnx.ModelProto) -> onnx.ModelProto:
    out = export_model(import_model(proto))
    onnx.checker.check_model(out, full_check=True)
    return out


def _vi(name, dtype=TP.FLOAT, shape=(2,)):
    return h.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), opset=21, **kw) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    imports = [h.make_opsetid("", opset)] + kw.pop("extra_imports", [])
    # onnx writes its newest IR version by default; onnxruntime may not read it yet.
    return h.make_model(graph, opset_imports=imports, ir_version=10, **kw)


def _same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, feeds: dict, names=None) -> None:
    want = _ort(a).run(names, feeds)
    got = _ort(b).run(names, feeds)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


_BIG = {"bvlc_alexnet", "vgg19", "zfnet512"}


def test_light_models_exist() -> None:
    assert len(LIGHT) == 9


def _round_trip_param(path: str):
    """The largest five (1-2.5 s each) in the slow tier: exporting an initializer or a Conv is
    the same code for any size, and the four smaller models cover every op kind of the nine."""
    name = os.path.basename(path)[6:-5]
    slow = name in _BIG or name in {"resnet50", "densenet121"}
    return pytest.param(path, id=name, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("path", [_round_trip_param(p) for p in LIGHT])
def test_light_model_round_trip(path: str) -> None:
    """Import, export, check, and the same outputs in onnxruntime bit for bit. The six smaller
    models carry seeded random weights (their initializers exported as real data); the three
    with 240-550 MB fully connected layers keep the shipped constant fills, which export the
    same way (exporting an initializer is the same code for any size)."""
    from tests.models import light

    name = os.path.basename(path)[len("model_") : -len(".onnx")]
    original = onnx.load(path) if name in _BIG else light(name, seed=0)
    model = import_model(original.SerializeToString())
    out = export_model(model)
    onnx.checker.check_model(out)
    inits = {t.name for t in original.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in original.graph.input:
        if vi.name not in inits:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    assert feeds
    _same_outputs(original, out, feeds)
    # The export re-imports to the same IR text.
    assert str(import_model(out).graph) == str(model.graph)


def test_model_fields_survive() -> None:
    proto = _model(
        [h.make_node("Relu", ["x"], ["y"], name="r", doc_string="d")],
        [_vi("x", shape=("batch", None))],
        [_vi("y", shape=("batch", None))],
        producer_name="p",
        producer_version="9",
        doc_string="doc",
        model_version=7,
    )
    proto.domain = "org.example"
    h.set_model_props(proto, {"k": "v"})
    out = _round_trip(proto)
    assert (out.producer_name, out.producer_version, out.doc_string) == ("p", "9", "doc")
    assert (out.model_version, out.domain, out.ir_version) == (7, "org.example", proto.ir_version)
    assert {e.key: e.value for e in out.metadata_props} == {"k": "v"}
    assert [(o.domain, o.version) for o in out.opset_import] == [("", 21)]
    assert out.graph.node[0].name == "r" and out.graph.node[0].doc_string == "d"
    dims = out.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and not dims[1].HasField("dim_value")
    assert not dims[1].dim_param


def test_intermediate_types_export_as_value_info() -> None:
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Neg", ["a"], ["y"])]
    out = _round_trip(_model(nodes, [_vi("x", shape=(2, 3))], [_vi("y", shape=(2, 3))]))
    (vi,) = out.graph.value_info
    assert vi.name == "a" and vi.type.tensor_type.elem_type == TP.FLOAT
    assert [d.dim_value for d in vi.type.tensor_type.shape.dim] == [2, 3]


def test_meta_is_not_exported() -> None:
    model = import_model(_model([h.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y")]))
    model.graph.nodes[0].meta["placement_reason"] = "marker-4242"
    model.graph.inputs[0].meta["note"] = "marker-4243"
    text = str(export_model(model))
    assert "marker-424" not in text


def _if_model() -> onnx.ModelProto:
    """y = If(c) then Relu(x + b) else Neg(x) * b; branches capture outer values."""
    then = h.make_graph([h.make_node("Relu", ["xb"], ["t"])], "then", [], [_vi("t")])
    other = h.make_graph(
        [h.make_node("Neg", ["x"], ["n"]), h.make_node("Mul", ["n", "b"], ["e"])],
        "else",
        [],
        [_vi("e")],
    )
    nodes = [
        h.make_node("Add", ["x", "b"], ["xb"]),
        h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    b = nh.from_array(np.array([1.0, -3.0], np.float32), "b")
    return _model(nodes, [h.make_tensor_value_info("c", TP.BOOL, []), _vi("x")], [_vi("y")], [b])


def test_if_with_outer_capture_round_trip() -> None:
    proto = _if_model()
    out = _round_trip(proto)
    then = next(a.g for a in out.graph.node[1].attribute if a.name == "then_branch")
    assert list(then.node[0].input) == ["xb"]  # captured by name
    x = np.array([0.5, 1.0], np.float32)
    for c in (True, False):
        _same_outputs(proto, out, {"c": np.array(c), "x": x})


def test_loop_round_trip() -> None:
    # acc = x; repeat n times: acc = acc * 2 + step (step captured from the outer graph);
    # also scan-outputs every acc.
    body = h.make_graph(
        [
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
            h.make_node("Mul", ["acc_in", "two"], ["m"]),
            h.make_node("Add", ["m", "step"], ["acc_out"]),
            h.make_node("Identity", ["acc_out"], ["scan"]),
        ],
        "body",
        [
            h.make_tensor_value_info("i", TP.INT64, []),
            h.make_tensor_value_info("cond_in", TP.BOOL, []),
            _vi("acc_in"),
        ],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), _vi("acc_out"), _vi("scan")],
        [nh.from_array(np.array(2.0, np.float32), "two")],
    )
    step = nh.from_array(np.array([1.0, -1.0], np.float32), "step")
    proto = _model(
        [h.make_node("Loop", ["n", "", "x"], ["y", "ys"], body=body)],
        [h.make_tensor_value_info("n", TP.INT64, []), _vi("x")],
        [_vi("y"), _vi("ys", shape=(None, 2))],
        [step],
    )
    out = _round_trip(proto)
    _same_outputs(proto, out, {"n": np.array(4, np.int64), "x": np.array([1.0, 2.0], np.float32)})


def test_sequence_values_round_trip() -> None:
    nodes = [
        h.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
        h.make_node("SequenceInsert", ["seq", "x"], ["seq2"]),
        h.make_node("ConcatFromSequence", ["seq2"], ["y"], axis=0),
    ]
    seq_type = h.make_tensor_sequence_value_info("s_out", TP.FLOAT, None)
    proto = _model(
        nodes + [h.make_node("Identity", ["seq2"], ["s_out"])],
        [_vi("x")],
        [_vi("y", shape=(6,)), seq_type],
    )
    model = import_model(proto)
    assert not model.graph.outputs[1].is_tensor
    out = export_model(model)
    onnx.checker.check_model(out)
    assert out.graph.output[1].type.WhichOneof("value") == "sequence_type"
    seq_vi = {vi.name: vi for vi in out.graph.value_info}["seq"]
    assert seq_vi.type.WhichOneof("value") == "sequence_type"
    _same_outputs(proto, out, {"x": np.array([1.0, 2.0], np.float32)})


def test_low_precision_initializers_round_trip() -> None:
    arrays = {
        "bf": np.array([1.5, -2.0, 0.25], dtype=ml_dtypes.bfloat16),
        "f8": np.array([1.0, 0.5, -4.0], dtype=ml_dtypes.float8_e4m3fn),
        "f8b": np.array([1.0, 0.5, -4.0], dtype=ml_dtypes.float8_e5m2),
        "i4": np.array([-3, 0, 7], dtype=ml_dtypes.int4),
        "f16": np.array([1.5, -2.0, 0.25], dtype=np.float16),
    }
    inits = [nh.from_array(a, n) for n, a in arrays.items()]
    nodes = [h.make_node("Cast", [n], [n + "_f"], to=TP.FLOAT) for n in arrays]
    proto = _model(nodes, [], [_vi(n + "_f", shape=(3,)) for n in arrays], inits)
    out = _round_trip(proto)
    by_name = {t.name: t for t in out.graph.initializer}
    for name, array in arrays.items():
        t = by_name[name]
        assert t.data_type == proto.graph.initializer[list(arrays).index(name)].data_type
        back = nh.to_array(t)
        assert back.dtype == array.dtype
        np.testing.assert_array_equal(back.astype(np.float32), array.astype(np.float32))
    _same_outputs(proto, out, {})


def test_large_initializer_uses_raw_data_and_strings_survive() -> None:
    w = nh.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    s = h.make_tensor("s", TP.STRING, [2], [b"ab", b"\xff\xfe"])  # not UTF-8: kept as bytes
    proto = _model(
        [h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("Identity", ["s"], ["s_out"])],
        [_vi("x", shape=(1, 64))],
        [_vi("y", shape=(1, 64)), _vi("s_out", TP.STRING, (2,))],
        [w, s],
    )
    out = _round_trip(proto)
    by_name = {t.name: t for t in out.graph.initializer}
    assert len(by_name["w"].raw_data) == 4096 * 4
    assert list(by_name["s"].string_data) == [b"ab", b"\xff\xfe"]
    # onnxruntime cannot hand back non-UTF-8 strings: compare the numeric output only.
    _same_outputs(proto, out, {"x": np.ones((1, 64), np.float32)}, ["y"])


def test_every_attribute_type_round_trips() -> None:
    # A plugin-domain op: the checker does not know its attributes, so any set is legal.
    schema = onnx.defs.OpSchema("Anything", "com.test", 1)
    registry = SchemaRegistry()
    registry.add(schema)
    proto = _model(
        [h.make_node("Anything", ["x"], ["y"], domain="com.test")],
        [_vi("x")],
        [_vi("y")],
        extra_imports=[h.make_opsetid("com.test", 1)],
    )
    model = import_model(proto, custom_schemas=registry)
    node = model.graph.nodes[0]
    tp = h.make_tensor_type_proto(TP.FLOAT, [2])
    sparse = np.array([[0.0, 2.0], [0.0, 0.0]], np.float32)
    attrs = [
        Attr("f", AttrType.FLOAT, 0.5),
        Attr("i", AttrType.INT, -3),
        Attr("s", AttrType.STRING, "h\u00e9"),
        Attr("t", AttrType.TENSOR, np.eye(2)),
        Attr("sp", AttrType.SPARSE_TENSOR, sparse),
        Attr("tp", AttrType.TYPE_PROTO, tp),
        Attr("fs", AttrType.FLOATS, [1.0, 2.5]),
        Attr("is", AttrType.INTS, []),
        Attr("ss", AttrType.STRINGS, ["a", "b"]),
        Attr("ts", AttrType.TENSORS, [np.arange(3, dtype=np.int64)]),
        Attr("sps", AttrType.SPARSE_TENSORS, [sparse]),
        Attr("tps", AttrType.TYPE_PROTOS, [tp, tp]),
    ]
    for a in attrs:
        node.attributes[a.name] = a
    back = import_model(export_model(model).SerializeToString(), custom_schemas=registry)
    got = back.graph.nodes[0].attributes
    for a in attrs:
        assert got[a.name].type == a.type, a.name
        if a.type in (AttrType.TENSOR, AttrType.SPARSE_TENSOR):
            np.testing.assert_array_equal(got[a.name].value, a.value)
            assert got[a.name].value.dtype == np.asarray(a.value).dtype
        elif a.type in (AttrType.TENSORS, AttrType.SPARSE_TENSORS):
            for g, w in zip(got[a.name].value, a.value):
                np.testing.assert_array_equal(g, w)
        else:
            assert got[a.name].value == a.value, a.name


def test_wrongly_typed_attribute_is_a_graph_error() -> None:
    from anychip.errors import GraphError

    model = import_model(_model([h.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y")]))
    model.graph.nodes[0].attributes["bad"] = Attr("bad", AttrType.INTS, "not ints")
    with pytest.raises(GraphError, match="bad"):
        export_model(model)


def test_ir3_model_is_written_as_ir4_with_weights_as_constants() -> None:
    model = import_model(LIGHT[0])
    assert model.ir_version == 3
    # Before IR 4 initializers listed as inputs are constants: they are not model inputs.
    assert all(v.const is None for v in model.graph.inputs)
    model.graph.add_initializer(Value("extra", const=np.zeros((), np.float32)))
    out = export_model(model)
    # Initializers that are not graph inputs are not legal before IR version 4.
    assert out.ir_version == 4
    onnx.checker.check_model(out)


def test_output_type_is_exported() -> None:
    model = import_model(_model([h.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y")]))
    assert model.graph.outputs[0].dtype == DType.FLOAT
    out = export_model(model)
    assert out.graph.output[0].type.tensor_type.elem_type == TP.FLOAT


def test_domain_added_by_a_pass_is_imported() -> None:
    from anychip.ir import Node

    model = import_model(_model([h.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y")]))
    g = model.graph
    relu = g.nodes[0]
    fused_out = Value("fused", DType.FLOAT, [2])
    g.append(Node("FusedThing", [relu.outputs[0]], [fused_out], domain="anychip", version=2))
    g.outputs.append(fused_out)
    out = export_model(model)
    assert {(o.domain, o.version) for o in out.opset_import} == {("", 21), ("anychip", 2)}
    onnx.checker.check_model(out)
