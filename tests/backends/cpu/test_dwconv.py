"""``backends/cpu/native/dwconv.py``: depthwise convolutions in C on channels-last tensors, reached
through
``onednn/conv.conv``. Equal to onnxruntime on seeded random inputs and weights (strides, pads,
dilations, odd sizes, channels not a multiple of 16, batches, each activation, a residual,
NaN and Inf); the C path ran (``RUNS``); one and two threads give the same bits; without a
compiler oneDNN runs it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.backends.cpu.native import dwconv
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn import conv as oconv
from anychip.cli.bench import _thread_limit

pytestmark = pytest.mark.skipif(_lib.get() is None, reason="oneDNN not loadable here")
F = TensorProto.FLOAT
C_ = _lib.C
ACTS = {
    None: (None, None),
    "Relu": (helper.make_node("Relu", ["s"], ["y"]), (C_.eltwise_relu, 0.0, 0.0)),
    "LeakyRelu": (
        helper.make_node("LeakyRelu", ["s"], ["y"], alpha=0.1),
        (C_.eltwise_relu, 0.1, 0.0),
    ),
    "Clip": (
        helper.make_node("Clip", ["s", "lo", "hi"], ["y"]),
        (C_.eltwise_clip, 0.0, 6.0),
    ),
}
# (n, c, h, w, kernel, stride, pads, dilation)
CASES = [
    (1, 64, 14, 14, 3, 1, (1, 1, 1, 1), 1),
    (1, 48, 15, 13, 3, 2, (1, 1, 1, 1), 1),
    (2, 37, 11, 9, 3, 1, (1, 1, 1, 1), 1),
    (1, 130, 9, 10, 3, 2, (0, 1, 1, 0), 1),
    (1, 24, 12, 17, 5, 1, (2, 2, 2, 2), 1),
    (3, 20, 16, 16, 7, 2, (3, 3, 3, 3), 1),
    (1, 80, 13, 13, 3, 1, (2, 2, 2, 2), 2),
    (1, 16, 5, 6, 3, 1, (0, 0, 0, 0), 1),
]


@pytest.fixture(autouse=True, params=["native", "portable"])
def _every_shape(monkeypatch, request):
    """The kernel on every shape here (small ones stay on oneDNN in use), once as built for
    this CPU and once with the portable loops only (what a CPU without AVX-512 compiles; on
    such a CPU both runs take them)."""
    monkeypatch.setattr(dwconv, "MIN_CHANNELS", 0)
    monkeypatch.setattr(dwconv, "MIN_WIDTH", 0)
    monkeypatch.setattr(dwconv, "MAX_WIDTH", 1 << 30)
    lib = dwconv._lib()
    native = lib is not None and lib[1].ac_dw_simd()
    monkeypatch.setattr(dwconv, "PORTABLE", request.param == "portable" or not native)


def _reference(x, w, b, z, act, stride, pads, dil):
    c = x.shape[1]
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["c"], group=c, strides=[stride] * 2, pads=list(pads),
            dilations=[dil] * 2,
        ),
        helper.make_node("Add", ["c", "z"], ["s"]) if z is not None else
        helper.make_node("Identity", ["c"], ["s"]),
    ]  # fmt: skip
    node = ACTS[act][0]
    nodes.append(node if node is not None else helper.make_node("Identity", ["s"], ["y"]))
    names = ["x", "w", "b"] + (["z"] if z is not None else [])
    inits = [
        onnx.numpy_helper.from_array(np.float32(0.0), "lo"),
        onnx.numpy_helper.from_array(np.float32(6.0), "hi"),
    ]
    graph = helper.make_graph(
        nodes, "dw", [helper.make_tensor_value_info(n, F, None) for n in names],
        [helper.make_tensor_value_info("y", F, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": x, "w": w, "b": b} | ({"z": z} if z is not None else {})
    return sess.run(None, feeds)[0]


def _channels_last(a: np.ndarray) -> np.ndarray:
    return P.from_channels_last(np.ascontiguousarray(a.transpose(0, 2, 3, 1)))


def _case(seed, n, c, h, w, k, residual, stride, pads, dil):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((c, 1, k, k)) * 0.5).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    oh = (h + pads[0] + pads[2] - dil * (k - 1) - 1) // stride + 1
    ow = (w + pads[1] + pads[3] - dil * (k - 1) - 1) // stride + 1
    z = rng.standard_normal((n, c, oh, ow)).astype(np.float32) if residual else None
    return x, wt, b, z


def _attrs(c, k, stride, pads, dil):
    return {"group": c, "kernel_shape": [k, k], "strides": [stride] * 2, "pads": list(pads),
            "dilations": [dil] * 2}  # fmt: skip


def _ours(x, w, b, z, act, attrs, channels_last=True):
    runs = dwconv.RUNS["dwconv"]
    zc = None if z is None else _channels_last(z)
    y = oconv.conv(_channels_last(x), w, b, zc, ACTS[act][1], attrs, channels_last)
    return y, dwconv.RUNS["dwconv"] - runs


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("residual", [False, True])
def test_equals_onnxruntime(case, act, residual):
    n, c, h, w, k, stride, pads, dil = case
    x, wt, b, z = _case(7 + c + h, n, c, h, w, k, residual, stride, pads, dil)
    y, ran = _ours(x, wt, b, z, act, _attrs(c, k, stride, pads, dil))
    assert ran == 1
    assert not y.flags.c_contiguous  # channels-last for a oneDNN reader
    ref = _reference(x, wt, b, z, act, stride, pads, dil)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_planar_output_into_the_plan():
    x, wt, b, _ = _case(3, 1, 40, 12, 12, 3, False, 1, (1, 1, 1, 1), 1)
    out = np.empty((1, 40, 12, 12), np.float32)
    attrs = _attrs(40, 3, 1, (1, 1, 1, 1), 1)
    runs = dwconv.RUNS["dwconv"]
    y = oconv.conv(_channels_last(x), wt, b, None, None, attrs, False, out)
    assert dwconv.RUNS["dwconv"] == runs + 1 and y is out
    np.testing.assert_allclose(y, _reference(x, wt, b, None, None, 1, (1,) * 4, 1), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("act", list(ACTS))
def test_nan_and_inf_propagate(act):
    x, wt, b, _ = _case(5, 1, 35, 10, 10, 3, False, 1, (1, 1, 1, 1), 1)
    x[0, 3, 4, 4] = np.nan
    x[0, 20, 0, 7] = np.inf
    x[0, 33, 9, 0] = -np.inf
    y, ran = _ours(x, wt, b, None, act, _attrs(35, 3, 1, (1, 1, 1, 1), 1))
    ref = _reference(x, wt, b, None, act, 1, (1, 1, 1, 1), 1)
    assert ran == 1 and np.isnan(ref).any() and np.isinf(ref).any() or act == "Clip"
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_one_and_two_threads_give_the_same_bits(monkeypatch):
    x, wt, b, z = _case(9, 2, 72, 21, 19, 3, True, 1, (1, 1, 1, 1), 1)
    attrs = _attrs(72, 3, 1, (1, 1, 1, 1), 1)
    monkeypatch.setattr(dwconv, "PARALLEL_FMAS", 0)
    with _thread_limit(1):
        one, _ = _ours(x, wt, b, z, "Relu", attrs)
    with _thread_limit(2):
        two, ran = _ours(x, wt, b, z, "Relu", attrs)
    assert ran == 1
    assert np.array_equal(one, two)


def test_without_a_compiler_onednn_runs_it(monkeypatch):
    x, wt, b, _ = _case(11, 1, 24, 9, 9, 3, False, 2, (1, 1, 1, 1), 1)
    attrs = _attrs(24, 3, 2, (1, 1, 1, 1), 1)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    dwconv.forget()
    try:
        y, ran = _ours(x, wt, b, None, "Relu", attrs)
    finally:
        monkeypatch.delenv("CC")
        dwconv.forget()
    assert ran == 0
    ref = _reference(x, wt, b, None, "Relu", 2, (1, 1, 1, 1), 1)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_declines_what_it_does_not_run():
    x, wt, b, _ = _case(13, 1, 16, 8, 8, 3, False, 1, (1, 1, 1, 1), 1)
    sig = tuple((k, tuple(v)) for k, v in _attrs(16, 3, 1, (1,) * 4, 1).items() if k != "group")
    geo = oconv._geometry(x.shape, wt.shape, sig + (("group", 16),))
    assert not dwconv.applies(x, wt, 16)  # planar NCHW source: oneDNN reorders it
    xc = _channels_last(x)
    assert dwconv.applies(xc, wt, 16)
    assert not dwconv.applies(xc.astype(np.float64), wt, 16)
    assert not dwconv.applies(xc, wt[:8], 8)  # not depthwise
    tanh = (C_.eltwise_tanh, 0.0, 0.0)
    assert dwconv.depthwise(xc, wt, b, None, tanh, geo, True) is None


def _pointwise_then_depthwise(
    rng: np.random.Generator, c: int, cin: int, hw: int, stride: int
) -> tuple[onnx.ModelProto, np.ndarray]:
    """A 1x1 convolution (oneDNN, channels-last out) from ``cin`` to ``c`` channels, then a
    depthwise 3x3 with a bias and Relu; seeded weights and input (``[1, cin, hw, hw]``)."""
    w1 = (rng.standard_normal((c, cin, 1, 1)) * 0.4).astype(np.float32)
    wd = (rng.standard_normal((c, 1, 3, 3)) * 0.4).astype(np.float32)
    bd = rng.standard_normal(c).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["X", "W1"], ["a"]),
        helper.make_node("Conv", ["a", "Wd", "Bd"], ["d"], group=c, pads=[1, 1, 1, 1],
                         strides=[stride, stride]),
        helper.make_node("Relu", ["d"], ["Y"]),
    ]  # fmt: skip
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in {"W1": w1, "Wd": wd, "Bd": bd}.items()]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", F, [1, cin, hw, hw])],
        [helper.make_tensor_value_info("Y", F, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, rng.standard_normal((1, cin, hw, hw)).astype(np.float32)


def _onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return ref.run(None, {"X": x})[0]


def test_in_a_session_after_a_onednn_conv():
    """A 1x1 convolution (oneDNN, channels-last out) then a depthwise 3x3 with Relu."""
    model, x = _pointwise_then_depthwise(np.random.default_rng(17), 40, 8, 15, 2)
    runs = dwconv.RUNS["dwconv"]
    ours = anychip.load(model.SerializeToString(), "cpu").run(None, {"X": x})[0]
    assert dwconv.RUNS["dwconv"] > runs
    np.testing.assert_allclose(ours, _onnxruntime(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_session_node_takes_the_threads_given(monkeypatch, threads):
    """In a session the convolution kernel leaves oneDNN on one OpenMP thread for small work
    (``_lib.team_for``); the depthwise kernel still runs on the threads given (it read
    ``omp.max_threads()`` there, one, and ran MobileNet's depthwise nodes on one thread at
    two: 90 us against 227 after a 1x1 convolution on oneDNN's team)."""
    seen = []
    lib = dwconv._portable() if dwconv.PORTABLE else dwconv._lib()

    class Spy:  # the C library, its calls' thread counts noted
        def __getattr__(self, name):
            return getattr(lib[1], name)

        def ac_dwconv(self, *args):
            seen.append(args[9])
            return lib[1].ac_dwconv(*args)

    fake = (lib[0], Spy(), lib[2])
    monkeypatch.setattr(dwconv, "_portable" if dwconv.PORTABLE else "_lib", lambda: fake)
    model, x = _pointwise_then_depthwise(np.random.default_rng(23), 64, 16, 28, 1)
    with _thread_limit(threads):
        sess = anychip.load(
            model.SerializeToString(), "cpu", device_options={"cpu": {"replay": False}}
        )
        ours = sess.run(None, {"X": x})[0]
    assert seen == [threads]  # 64 x 28 x 28 x 9 multiply-adds: over PARALLEL_FMAS
    np.testing.assert_allclose(ours, _onnxruntime(model, x), rtol=1e-5, atol=1e-5)


def test_shapes_left_to_onednn(monkeypatch):
    """The measured rule: stride 1 only for outputs 8 to 16 wide, 64 channels or more."""
    monkeypatch.setattr(dwconv, "MIN_CHANNELS", 64)
    monkeypatch.setattr(dwconv, "MIN_WIDTH", 8)
    monkeypatch.setattr(dwconv, "MAX_WIDTH", 16)
    for c, hw, stride, runs in [(64, 14, 1, 1), (64, 28, 1, 0), (64, 7, 1, 0), (64, 28, 2, 1),
                                (32, 14, 1, 0)]:  # fmt: skip
        x, wt, b, _ = _case(c + hw, 1, c, hw, hw, 3, False, stride, (1, 1, 1, 1), 1)
        y, ran = _ours(x, wt, b, None, "Clip", _attrs(c, 3, stride, (1, 1, 1, 1), 1))
        assert ran == runs, (c, hw, stride)
        ref = _reference(x, wt, b, None, "Clip", stride, (1, 1, 1, 1), 1)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_a_node_remembers_its_depthwise_path(monkeypatch):
    """A node's depthwise convolution is remembered (``conv._Depthwise``): later calls with new
    sources and residuals go straight to the kernel and equal onnxruntime; a source of another
    shape takes the full path again; ``ANYCHIP_DWCONV=0`` set later sends the call to oneDNN."""
    c, k, stride, pads = 40, 3, 1, (1, 1, 1, 1)
    attrs = _attrs(c, k, stride, pads, 1)
    memo: dict = {}
    for seed in range(3):
        x, wt, b, z = _case(30, 1, c, 9, 11, k, True, stride, pads, 1)
        if seed:  # the same weights, a new source and residual every call
            x, _, _, z = _case(30 + seed, 1, c, 9, 11, k, True, stride, pads, 1)
        if seed == 0:
            w0, b0 = wt, b
        runs = dwconv.RUNS["dwconv"]
        y = oconv.conv(_channels_last(x), w0, b0, _channels_last(z), ACTS["Relu"][1], attrs,
                       True, memo=memo)  # fmt: skip
        assert dwconv.RUNS["dwconv"] == runs + 1
        assert isinstance(memo.get("fast"), oconv._Depthwise), seed
        ref = _reference(x, w0, b0, z, "Relu", stride, pads, 1)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    x2, _, _, _ = _case(40, 1, c, 7, 6, k, False, stride, pads, 1)  # another shape
    y2 = oconv.conv(_channels_last(x2), w0, b0, None, None, attrs, True, memo=memo)
    np.testing.assert_allclose(y2, _reference(x2, w0, b0, None, None, stride, pads, 1),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    monkeypatch.setenv("ANYCHIP_DWCONV", "0")
    runs = dwconv.RUNS["dwconv"]
    y3 = oconv.conv(_channels_last(x2), w0, b0, None, None, attrs, True, memo=memo)
    assert dwconv.RUNS["dwconv"] == runs  # oneDNN ran it
    np.testing.assert_allclose(y3, y2, rtol=1e-5, atol=1e-5)
