"""Fuzzing the importer and runtime with mutated models (hypothesis).

Seed models are onnx node cases; each example mutates one (bytes flipped or cut, or a protobuf
field changed: op type, attribute, input name, dimension, element type, opset, node dropped or
duplicated), then loads and runs it on the CPU with random feeds. The only acceptable outcomes
are a run or an ``AnychipError``; where onnxruntime runs the same mutated model, anychip's
outputs must match it (or anychip refuses with a reason). A process abort fails the test run.

The bound in CI is ``ANYCHIP_FUZZ_EXAMPLES`` (default 300) examples per test; the documented
long run is ``ANYCHIP_FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz.py -n 0``.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anychip
from anychip.conformance.cases import all_cases, load_case

EXAMPLES = int(os.environ.get("ANYCHIP_FUZZ_EXAMPLES", "300"))
SEEDS = (
    "test_add_bcast",
    "test_relu",
    "test_matmul_2d",
    "test_gemm_default_single_elem_vector_bias",
    "test_softmax_axis_1",
    "test_conv_with_strides_padding",
    "test_maxpool_2d_pads",
    "test_batchnorm_epsilon",
    "test_reshape_reordered_all_dims",
    "test_gather_0",
    "test_slice",
    "test_concat_2d_axis_0",
    "test_transpose_default",
    "test_expand_dim_changed",
    "test_where_example",
    "test_lstm_defaults",
)
OPS = [
    "Add",
    "Relu",
    "MatMul",
    "Gemm",
    "Softmax",
    "Conv",
    "Reshape",
    "Gather",
    "Slice",
    "Concat",
    "Transpose",
    "Expand",
    "Where",
    "Identity",
    "Cast",
    "Tile",
    "Pad",
    "Foo",
]
MAX_ELEMENTS = 1 << 20


def _seeds() -> dict[str, bytes]:
    by_name = {c.name: c for c in all_cases("node")}
    return {n: load_case(by_name[n])[0].SerializeToString() for n in SEEDS if n in by_name}


SEED_MODELS = _seeds()


def _mutate_field(model: onnx.ModelProto, data: st.DataObject) -> None:
    g = model.graph
    kind = data.draw(
        st.sampled_from(["op", "attr", "input", "dim", "elem", "opset", "drop", "dup", "init_dims"])
    )
    if kind in ("op", "attr", "input", "drop", "dup") and not g.node:
        return
    node = g.node[data.draw(st.integers(0, max(0, len(g.node) - 1)))] if g.node else None
    if kind == "op":
        node.op_type = data.draw(st.sampled_from(OPS))
    elif kind == "attr" and node.attribute:
        a = node.attribute[data.draw(st.integers(0, len(node.attribute) - 1))]
        if a.type == onnx.AttributeProto.INT:
            a.i = data.draw(st.integers(-(1 << 40), 1 << 40))
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = data.draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
        elif a.type == onnx.AttributeProto.INTS and a.ints:
            a.ints[data.draw(st.integers(0, len(a.ints) - 1))] = data.draw(st.integers(-9, 9))
    elif kind == "input" and node.input:
        i = data.draw(st.integers(0, len(node.input) - 1))
        node.input[i] = data.draw(
            st.sampled_from(["", "nope", node.output[0] if node.output else "x"])
        )
    elif kind in ("dim", "elem"):
        vis = list(g.input) + list(g.output)
        vi = vis[data.draw(st.integers(0, len(vis) - 1))]
        tt = vi.type.tensor_type
        if kind == "elem":
            tt.elem_type = data.draw(st.integers(0, 26))
        elif tt.shape.dim:
            d = tt.shape.dim[data.draw(st.integers(0, len(tt.shape.dim) - 1))]
            d.dim_value = data.draw(st.sampled_from([-7, -1, 0, 1, 3, 1 << 40]))
    elif kind == "opset":
        model.opset_import[0].version = data.draw(st.integers(-1, 40))
    elif kind == "drop":
        g.node.remove(node)
    elif kind == "dup":
        g.node.append(node)
    elif kind == "init_dims" and g.initializer:
        t = g.initializer[0]
        if t.dims:
            t.dims[0] = data.draw(st.integers(-3, 1 << 33))


def _mutated(data: st.DataObject) -> bytes:
    raw = SEED_MODELS[data.draw(st.sampled_from(sorted(SEED_MODELS)))]
    how = data.draw(st.sampled_from(["bytes", "cut", "field", "field", "field"]))
    if how == "bytes":
        buf = bytearray(raw)
        for _ in range(data.draw(st.integers(1, 4))):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        return bytes(buf)
    if how == "cut":
        return raw[: data.draw(st.integers(0, len(raw) - 1))]
    model = onnx.ModelProto.FromString(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate_field(model, data)
    return model.SerializeToString()


def _feeds(sess: anychip.Session) -> dict[str, np.ndarray] | None:
    rng = np.random.default_rng(0)
    feeds = {}
    for info in sess.inputs:
        if info.shape is None or not info.dtype or any(not isinstance(d, int) for d in info.shape):
            return None
        if int(np.prod(info.shape, dtype=np.int64)) > MAX_ELEMENTS:
            return None
        dt = np.dtype(info.dtype.numpy)
        if dt.kind == "f":
            feeds[info.name] = rng.standard_normal(info.shape).astype(dt)
        elif dt.kind in "iu":
            feeds[info.name] = rng.integers(0, 3, size=info.shape).astype(dt)
        elif dt.kind == "b":
            feeds[info.name] = rng.random(info.shape) > 0.5
        else:
            return None
    return feeds


def _onnxruntime(model: bytes, feeds: dict) -> list | None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:
        return None


@settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(st.data())
def test_a_mutated_model_runs_or_is_refused_with_an_anychip_error(data):
    model = _mutated(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sess = anychip.load(model, devices=["cpu"])
            feeds = _feeds(sess)
            if feeds is None:
                return
            got = sess.run(None, feeds)
        except anychip.AnychipError:
            return
    want = _onnxruntime(model, feeds)
    if want is None:
        return
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


def test_the_seed_models_are_there():
    assert len(SEED_MODELS) >= 12, sorted(SEED_MODELS)
    pytest.importorskip("onnxruntime")
