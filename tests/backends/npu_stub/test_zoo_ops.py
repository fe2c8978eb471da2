"""The ops the Hugging Face zoo needed on the NPU (issue 47): 1-D Conv (lowered to the 2-D
conv by the ``lower_conv1d`` pass), InstanceNormalization, Einsum, ScatterND, AveragePool with
``ceil_mode``, Resize. Each runs strictly on ``npu,cpu`` (failover off) against onnxruntime on
seeded random inputs, with NaN and Inf where the op passes them through; the forms the NPU
refuses give a placement reason, so a non-strict session keeps them on the CPU."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

import anychip
from anychip.backends.npu_stub.passes import npu_passes
from anychip.errors import PlacementError
from tests.backends.npu_stub.conftest import ir_graph, run_on_npu, single_op

R = np.random.default_rng(47)


def rand(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def strict_npu(model) -> anychip.Session:
    return anychip.load(
        model.SerializeToString(),
        devices=["npu", "cpu"],
        strict=True,
        failover=False,
        cost_model=False,
        background_compile=False,
    )


def check_against_ort(model, feeds: dict, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    sess = strict_npu(model)
    assert set(sess.placement().by_device()) == {"npu"}, sess.placement()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = ref.run(None, feeds)
    for _ in range(2):  # compiled on the first run, the executable reused on the second
        got = sess.run(None, feeds)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def refused(model, reason: str) -> None:
    """Strict placement refuses the node naming ``reason``; a non-strict one runs it on the
    CPU with that reason."""
    with pytest.raises(PlacementError):
        strict_npu(model)
    sess = anychip.load(model.SerializeToString(), devices=["npu", "cpu"], cost_model=False)
    (rec,) = sess.placement().nodes
    assert rec.device == "cpu" and reason in rec.reason, rec


def with_specials(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    flat = x.reshape(-1)
    flat[1], flat[5], flat[-2] = np.nan, np.inf, -np.inf
    return x


# -- 1-D Conv ------------------------------------------------------------------------------
CONV1D = {  # name: (x shape, w shape, attributes): the zoo's forms and a few more
    "squeezebert_grouped_1x1": ((2, 32, 8), (32, 16, 1), {"group": 2}),
    "convbert_depthwise_padded": ((2, 32, 8), (32, 1, 9), {"group": 32, "pads": [4, 4]}),
    "whisper_strided": ((1, 32, 32), (32, 32, 3), {"pads": [1, 1], "strides": [2]}),
    "wav2vec2_front": ((1, 1, 400), (16, 1, 10), {"strides": [5]}),
    "wav2vec2_pos_conv": ((1, 32, 39), (32, 16, 16), {"group": 2, "pads": [8, 8]}),
    "dilated_asymmetric": ((2, 4, 20), (6, 4, 3), {"dilations": [2], "pads": [2, 1]}),
    "same_upper": ((1, 4, 11), (4, 4, 4), {"auto_pad": "SAME_UPPER", "strides": [2]}),
}


@pytest.mark.parametrize("name", sorted(CONV1D))
@pytest.mark.parametrize("bias", [True, False])
def test_conv1d_runs_on_the_npu(name, bias):
    xs, ws, attributes = CONV1D[name]
    x, w = rand(*xs), rand(*ws)
    inputs, consts = [x, w], {1: w}
    if bias:
        inputs.append(rand(ws[0]))
        consts[2] = inputs[-1]
    model, feeds = single_op("Conv", inputs, consts=consts, **attributes)
    check_against_ort(model, feeds)


def test_conv1d_with_computed_weights_and_nan():
    x, w = with_specials(rand(2, 4, 12)), rand(6, 4, 3)
    model, feeds = single_op("Conv", [x, w], pads=[1, 1])
    check_against_ort(model, feeds)


def test_conv1d_lowering_shows_in_the_partition():
    x, w = rand(1, 4, 10), rand(4, 4, 3)
    model, feeds = single_op("Conv", [x, w], consts={1: w})
    sess = strict_npu(model)
    sess.run(None, feeds)
    info = sess.placement().partitions[0].info
    assert "lower_conv1d" in info.get("passes", []), info


def test_3d_conv_is_refused_with_a_reason():
    x, w = rand(1, 2, 4, 4, 4), rand(2, 2, 3, 3, 3)
    model, _ = single_op("Conv", [x, w], consts={1: w})
    refused(model, "only 1-D or 2-D Conv")


# -- InstanceNormalization -----------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 16, 79), (2, 3, 5, 7)])
def test_instance_norm_runs_on_the_npu(shape):
    x = rand(*shape) * 3 + 1
    scale, bias = rand(shape[1]), rand(shape[1])
    model, feeds = single_op(
        "InstanceNormalization", [x, scale, bias], consts={1: scale, 2: bias}, epsilon=1e-5
    )
    check_against_ort(model, feeds)


def test_instance_norm_nan_and_inf_as_onnxruntime():
    x = with_specials(rand(2, 4, 9))
    scale, bias = rand(4), rand(4)
    model, feeds = single_op("InstanceNormalization", [x, scale, bias], consts={1: scale, 2: bias})
    check_against_ort(model, feeds)


# -- Einsum --------------------------------------------------------------------------------
EINSUM = {  # equation: operand shapes (Funnel's five, then the usual forms)
    "bind,bjnd->bnij": [(2, 8, 2, 16), (2, 8, 2, 16)],
    "td,dnh->tnh": [(16, 32), (32, 2, 16)],
    "binh,tnh->bnit": [(2, 4, 2, 16), (16, 2, 16)],
    "bind,snd->bnis": [(2, 8, 2, 16), (2, 2, 16)],
    "bnij,bjnd->bind": [(2, 2, 4, 8), (2, 8, 2, 16)],
    "bij,bjk->bik": [(3, 4, 5), (3, 5, 6)],
    "ij,jk": [(4, 5), (5, 3)],
    "ij,kj->ik": [(4, 5), (3, 5)],
    "bhqd,bhkd->bhqk": [(1, 2, 3, 4), (1, 2, 5, 4)],
    "i,j->ij": [(3,), (4,)],
    "ij,ij->": [(3, 4), (3, 4)],
    "ij->ji": [(3, 4)],
    "abcd->cadb": [(2, 3, 4, 5)],
}


@pytest.mark.parametrize("equation", sorted(EINSUM))
def test_einsum_runs_on_the_npu(equation):
    inputs = [rand(*s) for s in EINSUM[equation]]
    model, feeds = single_op("Einsum", inputs, equation=equation)
    check_against_ort(model, feeds, atol=1e-4)


def test_einsum_nan_and_inf_as_onnxruntime():
    a, b = with_specials(rand(2, 3, 4)), rand(2, 4, 5)
    model, feeds = single_op("Einsum", [a, b], equation="bij,bjk->bik")
    check_against_ort(model, feeds)


@pytest.mark.parametrize(
    "equation, shapes, reason",
    [
        ("ii->i", [(3, 3)], "repeated index"),
        ("ij->i", [(3, 4)], "sum over one operand"),
        ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)], "ellipsis"),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], "3 operands"),
        ("ij,j->", [(2, 3), (3,)], "summed over one operand only"),
    ],
)
def test_einsum_other_equations_are_refused_with_a_reason(equation, shapes, reason):
    model, _ = single_op("Einsum", [rand(*s) for s in shapes], equation=equation)
    refused(model, reason)


# -- ScatterND -----------------------------------------------------------------------------
def _scatter(data, idx, updates, **attributes):
    model, feeds = single_op(
        "ScatterND", [data, idx, updates], consts={1: idx}, opset=18, **attributes
    )
    return model, feeds


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
def test_scatter_nd_runs_on_the_npu(reduction):
    # Funnel's form: whole slices along the first axis, indices [8, 1]; negative ones too.
    idx = np.array([[3], [0], [-1], [7], [5], [1], [-6], [12]], np.int64)
    data, updates = with_specials(rand(15, 2, 8, 2)), rand(8, 2, 8, 2)
    check_against_ort(*_scatter(data, idx, updates, reduction=reduction))


def test_scatter_nd_max_is_refused_with_a_reason():
    idx = np.array([[1], [0]], np.int64)
    model, _ = _scatter(rand(3, 4), idx, rand(2, 4), reduction="max")
    refused(model, "ScatterND reduction 'max' not supported")


def test_scatter_nd_elements():
    idx = np.array([[0, 1, 2], [1, 0, 3], [1, 2, 0]], np.int64)
    check_against_ort(*_scatter(rand(2, 3, 4), idx, rand(3)))


# -- AveragePool with ceil_mode ------------------------------------------------------------
POOLS = {
    "funnel": ((2, 1, 8, 32), {"kernel_shape": [2, 1], "strides": [2, 1], "count_include_pad": 1}),
    "overhang": ((1, 3, 7, 9), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "overhang_pads_counted": (
        (1, 3, 7, 9),
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1},
    ),
    "overhang_pads": (
        (2, 2, 10, 5),
        {"kernel_shape": [2, 2], "strides": [3, 2], "pads": [1, 1, 0, 0]},
    ),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_average_pool_ceil_mode_runs_on_the_npu(name):
    shape, attributes = POOLS[name]
    x = with_specials(rand(*shape)) if name == "overhang" else rand(*shape)
    model, feeds = single_op("AveragePool", [x], ceil_mode=1, **attributes)
    check_against_ort(model, feeds)


# -- Resize --------------------------------------------------------------------------------
def _resize(x, *, scales=None, sizes=None, opset=18, **attributes):
    """A Resize model with constant scales or sizes (roi empty)."""
    inits, names = [], ["x", ""]
    for name, value, dtype in (("scales", scales, np.float32), ("sizes", sizes, np.int64)):
        if value is None:
            names.append("")
            continue
        inits.append(nh.from_array(np.asarray(value, dtype), name))
        names.append(name)
    node = h.make_node("Resize", names, ["y"], **attributes)
    graph = h.make_graph(
        [node],
        "resize",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), {"x": x}


RESIZES = {  # name: (input shape, scales, sizes, attributes)
    "mobilevit_up": ((1, 32, 1, 1), None, [1, 32, 2, 2], {"mode": "linear"}),
    "mobilevit_down": ((1, 32, 2, 2), None, [1, 32, 1, 1], {"mode": "linear"}),
    "linear_up_scales": ((2, 3, 5, 7), [1, 1, 2, 1.5], None, {"mode": "linear"}),
    "linear_down_odd": ((1, 2, 9, 7), None, [1, 2, 4, 3], {"mode": "linear"}),
    "linear_align_corners": (
        (1, 2, 4, 5),
        None,
        [1, 2, 7, 9],
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    ),
    "linear_pytorch_half_pixel": (
        (1, 2, 4, 5),
        None,
        [1, 2, 1, 9],
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    ),
    "linear_asymmetric_3d": (
        (2, 4, 6),
        [1, 1, 2.5],
        None,
        {"mode": "linear", "coordinate_transformation_mode": "asymmetric"},
    ),
    "nearest_up": ((1, 3, 4, 4), [1, 1, 2, 2], None, {"mode": "nearest"}),
    "nearest_asymmetric_floor": (
        (1, 3, 5, 6),
        [1, 1, 1.7, 0.6],
        None,
        {
            "mode": "nearest",
            "coordinate_transformation_mode": "asymmetric",
            "nearest_mode": "floor",
        },
    ),
    "nearest_round_prefer_ceil": (
        (1, 2, 5, 7),
        None,
        [1, 2, 8, 3],
        {"mode": "nearest", "nearest_mode": "round_prefer_ceil"},
    ),
    "nearest_ceil_tf": (
        (1, 2, 5, 7),
        None,
        [1, 2, 9, 4],
        {
            "mode": "nearest",
            "nearest_mode": "ceil",
            "coordinate_transformation_mode": "tf_half_pixel_for_nn",
        },
    ),
    "nearest_half_pixel_symmetric": (
        (1, 2, 5, 7),
        [1, 1, 1.6, 0.5],
        None,
        {"mode": "nearest", "coordinate_transformation_mode": "half_pixel_symmetric"},
    ),
}


@pytest.mark.parametrize("name", sorted(RESIZES))
def test_resize_runs_on_the_npu(name):
    shape, scales, sizes, attributes = RESIZES[name]
    model, feeds = _resize(rand(*shape), scales=scales, sizes=sizes, **attributes)
    check_against_ort(model, feeds)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_resize_nan_and_inf_as_onnxruntime(mode):
    x = with_specials(rand(1, 2, 4, 5))
    model, feeds = _resize(x, sizes=[1, 2, 7, 5], mode=mode)
    check_against_ort(model, feeds)


@pytest.mark.parametrize(
    "attributes, reason",
    [
        ({"mode": "cubic"}, "Resize mode='cubic' not supported"),
        (
            {"coordinate_transformation_mode": "tf_crop_and_resize"},
            "coordinate_transformation_mode='tf_crop_and_resize' not supported",
        ),
        ({"antialias": 1, "mode": "linear"}, "antialias=1"),
    ],
)
def test_resize_other_forms_are_refused_with_a_reason(attributes, reason):
    model, _ = _resize(rand(1, 2, 4, 4), scales=[1, 1, 2, 2], **attributes)
    refused(model, reason)


# -- the compiled bytes --------------------------------------------------------------------
def _artifact_cases():
    w = rand(4, 2, 3)
    idx = np.array([[2], [0]], np.int64)
    s = rand(4)
    return {
        "conv1d": single_op("Conv", [rand(1, 4, 9), w, rand(4)], consts={1: w}, group=2),
        "instance_norm": single_op(
            "InstanceNormalization", [rand(1, 4, 6), s, s], consts={1: s, 2: s}
        ),
        "einsum": single_op("Einsum", [rand(2, 3, 4), rand(4, 5)], equation="bij,jk->bik"),
        "scatter_nd": single_op(
            "ScatterND", [rand(3, 4), idx, rand(2, 4)], consts={1: idx}, reduction="add"
        ),
        "average_pool_ceil": single_op(
            "AveragePool", [rand(1, 2, 7, 7)], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1
        ),
        "resize": _resize(rand(1, 2, 3, 4), sizes=[1, 2, 5, 7], mode="linear"),
    }


@pytest.mark.parametrize("name", sorted(_artifact_cases()))
def test_new_ops_survive_the_compiled_bytes(name):
    """After the NPU's passes, compiled, written as bytes and loaded back bit for bit
    (``run_on_npu``), and equal to onnxruntime."""
    model, feeds = _artifact_cases()[name]
    graph = ir_graph(model)
    for p in npu_passes():
        p(graph)
    got = run_on_npu(graph, feeds)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for g, w in zip(got, ref.run(None, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_resize_with_axes_and_computed_sizes():
    """Sizes computed from the input's shape (TorchScript's form) on the index datapath, and
    scales over ``axes`` only (opset 18)."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Mul", ["s", "two"], ["sizes"]),
        h.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear"),
        h.make_node("Resize", ["x", "", "scales"], ["z"], mode="nearest", axes=[3, 2]),
    ]
    inits = [
        nh.from_array(np.array([1, 1, 2, 3], np.int64), "two"),
        nh.from_array(np.array([0.5, 3.0], np.float32), "scales"),
    ]
    graph = h.make_graph(
        nodes,
        "resize_computed",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])],
        [h.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    check_against_ort(model, {"x": rand(1, 2, 3, 4)})
