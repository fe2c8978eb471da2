"""CPU kernels of the long tail, part 2: control flow, sequences, optionals, strings, RNNs,
attention, signal, losses, random, ImageDecoder, ai.onnx.ml and training ops.

Three kinds of checks:
    * every onnx conformance node case that uses one of these ops (its expected outputs are
      the spec's) runs through ``anychip.load`` on the CPU;
    * random generators, whose outputs cannot match fixed data, are checked by distribution
      and by seed reproducibility;
    * configurations the bundled cases leave out (bidirectional LSTM with sequence_lens, GRU
      with linear_before_reset, reversed Scan axes, reference-wrapped ai.onnx.ml models) are
      compared with onnxruntime.
"""

from __future__ import annotations

import functools
import io
import sys
import warnings
from typing import Any

import numpy as np
import onnx
import onnx.backend.test.loader as loader
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.errors import AnychipError
from tests.node_cases import NodeCase, assert_outputs_close, load_case

TAIL2_OPS = frozenset(
    (
        "If Loop Scan SequenceAt SequenceConstruct SequenceEmpty SequenceErase SequenceInsert "
        "SequenceLength SequenceMap SplitToSequence ConcatFromSequence Optional "
        "OptionalGetElement OptionalHasElement StringConcat StringNormalizer StringSplit "
        "RegexFullMatch TfIdfVectorizer RNN LSTM GRU Attention RotaryEmbedding LinearAttention "
        "CausalConvWithState DFT STFT BlackmanWindow HammingWindow HannWindow MelWeightMatrix "
        "NegativeLogLikelihoodLoss SoftmaxCrossEntropyLoss Bernoulli RandomUniform RandomNormal "
        "RandomUniformLike RandomNormalLike Multinomial ImageDecoder ArrayFeatureExtractor "
        "Binarizer LabelEncoder TreeEnsemble Adagrad Adam Momentum FlexAttention"
    ).split()
)

# Cases whose outputs are random draws: checked by distribution below instead.
RANDOM_CASES = {"test_bernoulli", "test_bernoulli_double", "test_bernoulli_seed"}


class _Case:
    """One conformance case, in memory (node cases) or on disk (the "simple" models)."""

    def __init__(self, c: Any) -> None:
        self.name = c.name
        self.rtol, self.atol = c.rtol, c.atol
        if c.model is not None:
            self.model, self.data_sets = c.model, [(list(i), list(o)) for i, o in c.data_sets]
        else:
            self.model, self.data_sets = load_case(NodeCase(c.name, c.model_dir, c.rtol, c.atol))

    def __repr__(self) -> str:
        return self.name


@functools.lru_cache(maxsize=1)
def _cases() -> tuple[_Case, ...]:
    """Conformance cases whose top-level graph uses one of our ops (not the _expanded
    variants, which test other ops' kernels through the function body)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        every = loader.load_model_tests(kind="node") + loader.load_model_tests(kind="simple")
    out = []
    for c in every:
        if c.name.endswith("_expanded") or c.name in RANDOM_CASES:
            continue
        case = _Case(c)
        if {n.op_type for n in case.model.graph.node} & TAIL2_OPS:
            out.append(case)
    return tuple(out)


def test_case_selection_is_not_empty() -> None:
    names = {c.name for c in _cases()}
    assert len(names) > 250
    assert {"test_if", "test_loop11", "test_scan9_sum", "test_lstm_defaults"} <= names


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.name)
def test_conformance(case: _Case) -> None:
    sess = anychip.load(case.model, devices=["cpu"])
    names = [i.name for i in sess.inputs]
    for inputs, expected in case.data_sets:
        got = sess.run(None, dict(zip(names, inputs)))
        assert_outputs_close(got, list(expected), case.rtol, case.atol)


# -- helpers ----------------------------------------------------------------------------------
def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    opset: int = 21,
    extra: tuple[tuple[str, int], ...] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _f(name: str, shape: list[Any] | None = None, t: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, t, shape)


def _dims(rank: int) -> list[str]:
    """A shape of ``rank`` symbolic dimensions (the importer's checker wants a shape)."""
    return [f"d{i}" for i in range(rank)]


def _run(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    return anychip.load(model, devices=["cpu"]).run(None, feeds)


def _ort(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# -- random generators: distribution and seeds -----------------------------------------------
def _random_model(op: str, rank: int = 2, **attrs: Any) -> onnx.ModelProto:
    return _model([helper.make_node(op, [], ["y"], **attrs)], [], [_f("y", _dims(rank))])


def test_random_uniform_distribution_and_seed() -> None:
    m = _random_model("RandomUniform", shape=[200, 100], low=-2.0, high=3.0)
    (y,) = _run(m, {})
    assert y.dtype == np.float32 and y.shape == (200, 100)
    assert y.min() >= -2.0 and y.max() < 3.0
    assert abs(y.mean() - 0.5) < 0.05  # mean (low+high)/2, std of the mean ~0.01
    assert abs(y.std() - 5 / np.sqrt(12)) < 0.05
    seeded = _random_model("RandomUniform", 1, shape=[5], seed=3.0)
    assert np.array_equal(_run(seeded, {})[0], _run(seeded, {})[0])
    assert not np.array_equal(_run(m, {})[0], _run(m, {})[0])


def test_random_normal_distribution_and_dtype() -> None:
    m = _random_model(
        "RandomNormal", shape=[400, 100], mean=1.5, scale=2.0, dtype=TensorProto.DOUBLE
    )
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    (y,) = _run(m, {})
    assert y.dtype == np.float64
    assert abs(y.mean() - 1.5) < 0.05 and abs(y.std() - 2.0) < 0.05


def test_random_like_ops_take_shape_and_dtype_of_input() -> None:
    for op, attrs in (("RandomUniformLike", {"low": 0.0, "high": 1.0}), ("RandomNormalLike", {})):
        m = _model(
            [helper.make_node(op, ["x"], ["y"], **attrs)],
            [_f("x", [3, 50], TensorProto.DOUBLE)],
            [_f("y", _dims(2), TensorProto.DOUBLE)],
        )
        (y,) = _run(m, {"x": np.zeros((3, 50))})
        assert y.shape == (3, 50) and y.dtype == np.float64
        assert len(np.unique(y)) > 100


def test_bernoulli_frequency_follows_probabilities() -> None:
    m = _model(
        [helper.make_node("Bernoulli", ["p"], ["y"])],
        [_f("p", [3, 20000])],
        [_f("y", _dims(2))],
        22,
    )
    p = np.repeat(np.array([[0.0], [0.3], [1.0]], np.float32), 20000, axis=1)
    (y,) = _run(m, {"p": p})
    assert y.dtype == np.float32 and set(np.unique(y)) <= {0.0, 1.0}
    assert y[0].sum() == 0 and y[2].sum() == 20000
    assert abs(y[1].mean() - 0.3) < 0.02


def test_bernoulli_seed_reproducible() -> None:
    m = _model(
        [helper.make_node("Bernoulli", ["p"], ["y"], seed=7.0, dtype=TensorProto.INT32)],
        [_f("p", [100])],
        [_f("y", _dims(1), TensorProto.INT32)],
        22,
    )
    p = np.full(100, 0.5, np.float32)
    a, b = _run(m, {"p": p})[0], _run(m, {"p": p})[0]
    assert a.dtype == np.int32 and np.array_equal(a, b) and 20 < a.sum() < 80


def test_multinomial_frequencies() -> None:
    m = _model(
        [helper.make_node("Multinomial", ["x"], ["y"], sample_size=20000, dtype=TensorProto.INT64)],
        [_f("x", [1, 3])],
        [_f("y", _dims(2), TensorProto.INT64)],
    )
    probs = np.array([0.2, 0.5, 0.3])
    (y,) = _run(m, {"x": np.log(probs)[None].astype(np.float32)})
    assert y.shape == (1, 20000) and y.dtype == np.int64
    freq = np.bincount(y[0], minlength=3) / 20000
    np.testing.assert_allclose(freq, probs, atol=0.02)


# -- configurations compared with onnxruntime ------------------------------------------------
def test_lstm_bidirectional_with_sequence_lens_matches_onnxruntime() -> None:
    rng = np.random.default_rng(0)
    seq, batch, inp, hid = 5, 3, 4, 6
    feeds = {
        "X": rng.standard_normal((seq, batch, inp)).astype(np.float32),
        "W": rng.standard_normal((2, 4 * hid, inp)).astype(np.float32) * 0.5,
        "R": rng.standard_normal((2, 4 * hid, hid)).astype(np.float32) * 0.5,
        "B": rng.standard_normal((2, 8 * hid)).astype(np.float32) * 0.1,
        "L": np.array([5, 2, 4], np.int32),
        "H": rng.standard_normal((2, batch, hid)).astype(np.float32),
        "C": rng.standard_normal((2, batch, hid)).astype(np.float32),
        "P": rng.standard_normal((2, 3 * hid)).astype(np.float32) * 0.1,
    }
    node = helper.make_node(
        "LSTM",
        list(feeds),
        ["Y", "Yh", "Yc"],
        hidden_size=hid,
        direction="bidirectional",
        clip=3.0,
    )
    types = {"L": TensorProto.INT32}
    m = _model(
        [node],
        [_f(k, list(v.shape), types.get(k, TensorProto.FLOAT)) for k, v in feeds.items()],
        [_f("Y", _dims(4)), _f("Yh", _dims(3)), _f("Yc", _dims(3))],
    )
    for got, want in zip(_run(m, feeds), _ort(m, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_reverse_matches_onnxruntime_and_layout1_agrees(linear_before_reset: int) -> None:
    rng = np.random.default_rng(1)
    seq, batch, inp, hid = 4, 2, 3, 5
    feeds = {
        "X": rng.standard_normal((seq, batch, inp)).astype(np.float32),
        "W": rng.standard_normal((1, 3 * hid, inp)).astype(np.float32) * 0.5,
        "R": rng.standard_normal((1, 3 * hid, hid)).astype(np.float32) * 0.5,
        "B": rng.standard_normal((1, 6 * hid)).astype(np.float32) * 0.1,
    }

    def model(layout: int) -> onnx.ModelProto:
        node = helper.make_node(
            "GRU",
            list(feeds),
            ["Y", "Yh"],
            hidden_size=hid,
            direction="reverse",
            layout=layout,
            linear_before_reset=linear_before_reset,
        )
        ins = [_f(k, list(v.shape)) for k, v in feeds.items()]
        if layout:
            ins[0] = _f("X", [batch, seq, inp])
        return _model([node], ins, [_f("Y", _dims(4)), _f("Yh", _dims(3))])

    got = _run(model(0), feeds)
    for g, want in zip(got, _ort(model(0), feeds)):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)
    # onnxruntime has no batch-first GRU: layout=1 must equal layout=0 with axes moved.
    y1, yh1 = _run(model(1), {**feeds, "X": feeds["X"].transpose(1, 0, 2)})
    np.testing.assert_allclose(y1, got[0].transpose(2, 0, 1, 3), rtol=1e-6)
    np.testing.assert_allclose(yh1, got[1].transpose(1, 0, 2), rtol=1e-6)


def test_scan_reverse_axes_matches_onnxruntime() -> None:
    # Body: state' = state + x_t ; out_t = state' * 2
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s", "x"], ["s2"]),
            helper.make_node("Add", ["s2", "s2"], ["o"]),
        ],
        "body",
        [_f("s", [2]), _f("x", [2])],
        [_f("s2", [2]), _f("o", [2])],
    )
    node = helper.make_node(
        "Scan",
        ["init", "xs"],
        ["final", "outs"],
        body=body,
        num_scan_inputs=1,
        scan_input_axes=[1],
        scan_input_directions=[1],
        scan_output_axes=[-1],
        scan_output_directions=[1],
    )
    m = _model([node], [_f("init", [2]), _f("xs", [2, 4])], [_f("final", [2]), _f("outs", [2, 4])])
    feeds = {
        "init": np.array([1.0, -1.0], np.float32),
        "xs": np.arange(8, dtype=np.float32).reshape(2, 4),
    }
    for got, want in zip(_run(m, feeds), _ort(m, feeds)):
        np.testing.assert_allclose(got, want)


def test_reference_wrapped_ml_models_match_onnxruntime() -> None:
    nodes = [
        helper.make_node(
            "Scaler", ["x"], ["s"], domain="ai.onnx.ml", offset=[1.0, 2.0], scale=[0.5, 2.0]
        ),
        helper.make_node(
            "LinearRegressor",
            ["s"],
            ["y"],
            domain="ai.onnx.ml",
            coefficients=[0.3, -0.7],
            intercepts=[0.25],
        ),
    ]
    m = _model(nodes, [_f("x", [4, 2])], [_f("y", [4, 1])], 17, extra=(("ai.onnx.ml", 3),))
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(4, 2)}
    np.testing.assert_allclose(_run(m, feeds)[0], _ort(m, feeds)[0], rtol=1e-6)


def test_reference_kernels_are_named_in_the_placement_report() -> None:
    # Scaler has a native kernel now (op_ml_preprocess.py); FeatureVectorizer is still wrapped.
    node = helper.make_node(
        "FeatureVectorizer", ["x"], ["y"], domain="ai.onnx.ml", inputdimensions=[1]
    )
    m = _model([node], [_f("x", [2, 1])], [_f("y", [2, 1])], 17, extra=(("ai.onnx.ml", 3),))
    sess = anychip.load(m, devices=["cpu"])
    assert "reference" in str(sess.placement()).lower()


# -- errors users can hit ---------------------------------------------------------------------
def test_loop_without_trip_count_or_condition_is_a_model_error() -> None:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c"], ["c2"]),
            helper.make_node("Identity", ["v"], ["v2"]),
        ],
        "body",
        [_f("i", [], TensorProto.INT64), _f("c", [], TensorProto.BOOL), _f("v", [1])],
        [_f("c2", [], TensorProto.BOOL), _f("v2", [1])],
    )
    m = _model(
        [helper.make_node("Loop", ["", "", "x"], ["y"], body=body)], [_f("x", [1])], [_f("y", [1])]
    )
    with pytest.raises(AnychipError, match="never ends"):
        _run(m, {"x": np.zeros(1, np.float32)})


def test_sequence_at_out_of_range_names_the_range() -> None:
    nodes = [
        helper.make_node("SequenceConstruct", ["a", "a"], ["s"]),
        helper.make_node("SequenceAt", ["s", "i"], ["y"]),
    ]
    m = _model(nodes, [_f("a", [2]), _f("i", [], TensorProto.INT64)], [_f("y", [2])])
    with pytest.raises(AnychipError, match="out of range"):
        _run(m, {"a": np.zeros(2, np.float32), "i": np.array(5, np.int64)})


def _png(pixels: np.ndarray) -> np.ndarray:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def _decoder_model(fmt: str) -> onnx.ModelProto:
    return _model(
        [helper.make_node("ImageDecoder", ["b"], ["y"], pixel_format=fmt)],
        [_f("b", [None], TensorProto.UINT8)],
        [_f("y", _dims(3), TensorProto.UINT8)],
        20,
    )


def test_image_decoder_png_rgb_bgr_gray() -> None:
    pytest.importorskip("PIL")
    pixels = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    data = _png(pixels)
    assert np.array_equal(_run(_decoder_model("RGB"), {"b": data})[0], pixels)
    assert np.array_equal(_run(_decoder_model("BGR"), {"b": data})[0], pixels[..., ::-1])
    gray = _run(_decoder_model("Grayscale"), {"b": data})[0]
    assert gray.shape == (4, 5, 1) and gray.dtype == np.uint8
    bad = _run(_decoder_model("RGB"), {"b": np.array([1, 2, 3], np.uint8)})[0]
    assert bad.size == 0


def test_image_decoder_without_pillow_says_how_to_install(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(AnychipError, match="pip install Pillow"):
        _run(_decoder_model("RGB"), {"b": np.array([1, 2, 3], np.uint8)})
