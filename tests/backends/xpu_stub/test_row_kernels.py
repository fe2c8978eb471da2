"""The XPU's vectorized, threaded row and element-wise kernels (xpu_vmath.h, xpu_parallel.c)
against numpy in float64 and onnxruntime: odd row lengths (not multiples of the 16 lanes),
sizes above the threads' threshold, one and two threads, and the same bits on either count."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.backends.xpu_stub.driver import XpuDriver, set_num_threads
from anychip.backends.xpu_stub.driver import launch as K
from tests.backends.xpu_stub.test_driver import run_no_check as run

pytestmark = pytest.mark.skipif(
    not any(d.name == "xpu" and d.available for d in anychip.devices()),
    reason="the XPU driver could not be built here (no C compiler)",
)

#: (rows, length): 1, 15, 16, 17 and long rows; the later ones pass the threads' threshold.
ROWS = [(1, 1), (3, 15), (5, 16), (7, 17), (37, 129), (41, 1999), (300, 257)]


@pytest.fixture(scope="module")
def drv():
    driver = XpuDriver(heap_bytes=64 << 20, name="xpu-row-test")
    yield driver
    driver.close()


@pytest.fixture(params=[1, 2])
def threads(request):
    set_num_threads(request.param)
    yield request.param
    set_num_threads(None)


def _ulps(got: np.ndarray, want: np.ndarray) -> float:
    """Largest error in units of the float32 spacing at each wanted value (normal range)."""
    info = np.finfo(np.float32)
    normal = (np.abs(want) >= info.tiny) & (np.abs(want) <= info.max)
    ref = np.where(normal, want, 1.0).astype(np.float32)
    err = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(ref)).astype(np.float64)
    return float(err[normal].max()) if normal.any() else 0.0


def _softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("rows,length", ROWS)
def test_softmax_and_log_softmax_match_float64(drv, threads, rows, length):
    x = (np.random.default_rng(rows * length).standard_normal((rows, length)) * 4).astype(
        np.float32
    )
    got = run(drv, lambda t: K.xpu_softmax(t, -1), x)
    np.testing.assert_allclose(got, _softmax64(x), rtol=2e-6, atol=1e-7)
    got_log = run(drv, lambda t: K.xpu_softmax(t, -1, log=True), x)
    np.testing.assert_allclose(got_log, np.log(_softmax64(x)), rtol=2e-6, atol=2e-6)


def test_softmax_keeps_nan_rows_and_huge_values(drv):
    x = np.array([[0.0, np.nan, 1.0], [1e30, -1e30, 0.0], [-np.inf, 0.0, 0.0]], np.float32)
    got = run(drv, lambda t: K.xpu_softmax(t, -1), x)
    with np.errstate(invalid="ignore"):
        want = _softmax64(x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # equal_nan by default


@pytest.mark.parametrize("rows,length", ROWS[1:])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_matches_float64(drv, threads, rows, length, with_bias):
    rng = np.random.default_rng(rows + length)
    x = (rng.standard_normal((rows, length)) * 3 + 1).astype(np.float32)
    scale = rng.standard_normal(length).astype(np.float32)
    bias = rng.standard_normal(length).astype(np.float32) if with_bias else None
    tensors = [drv.upload(a) for a in (x, scale) + ((bias,) if with_bias else ())]
    y = K.xpu_layer_norm(tensors[0], tensors[1], tensors[2] if with_bias else None, -1, 1e-5)
    got = y.numpy()
    for t in (*tensors, y):
        t.free()
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    want = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * scale
    want = want + (bias if with_bias else 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layer_norm_node_matches_onnxruntime_with_broadcast_scale():
    """LayerNormalization over the last two axes, Scale [1, 77] broadcast, on the XPU alone."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((1, 77)).astype(np.float32), "g"),
        numpy_helper.from_array(rng.standard_normal(77).astype(np.float32), "b"),
    ]
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=1, epsilon=1e-3)
    io = [helper.make_tensor_value_info(v, TensorProto.FLOAT, [3, 50, 77]) for v in "xy"]
    g = helper.make_graph([node], "ln", io[:1], io[1:], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    model = m.SerializeToString()
    x = rng.standard_normal((3, 50, 77)).astype(np.float32)
    sess = anychip.load(model, devices=["xpu"], strict=True)
    assert sess.placement().by_device() == {"xpu": 1}
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_layer_norm_with_mean_output_stays_off_the_xpu():
    from onnx import TensorProto, helper, numpy_helper

    g = numpy_helper.from_array(np.ones(8, np.float32), "g")
    node = helper.make_node("LayerNormalization", ["x", "g"], ["y", "mean"], axis=-1)
    io = [helper.make_tensor_value_info(v, TensorProto.FLOAT, [2, 8]) for v in ("x", "y")]
    mean = helper.make_tensor_value_info("mean", TensorProto.FLOAT, [2, 1])
    graph = helper.make_graph([node], "ln", io[:1], [io[1], mean], [g])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = anychip.load(model.SerializeToString(), devices=["xpu", "cpu"], cost_model=False)
    (n,) = sess.placement().nodes
    assert n.device == "cpu" and "Mean or InvStdDev" in n.reason


UNARY = {
    "Exp": (np.exp, 6),
    "Tanh": (np.tanh, 3),
    "Sigmoid": (lambda x: 1 / (1 + np.exp(-x)), 5),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_vectorized_unary_within_a_few_ulp(drv, threads, op):
    fn, max_ulp = UNARY[op]
    rng = np.random.default_rng(len(op))
    x = np.concatenate(
        [rng.uniform(-90, 90, 70001), rng.uniform(-1, 1, 4097), [0.0, -0.0, 1e-30, 88.72]]
    ).astype(np.float32)
    got = run(drv, lambda t: K.xpu_unary(op, t), x)
    with np.errstate(over="ignore", under="ignore"):
        want = fn(x.astype(np.float64))
    assert _ulps(got, want) <= max_ulp
    assert np.all(np.isinf(got[want > np.finfo(np.float32).max]))
    tiny = np.abs(want) < np.finfo(np.float32).tiny  # flushed to 0 where libm gives subnormals
    assert np.all(np.abs(got[tiny]) < np.finfo(np.float32).tiny)


def test_unary_edges(drv):
    x = np.array([np.inf, -np.inf, np.nan, 100.0, -100.0, 89.0, -88.0], np.float32)
    with np.errstate(over="ignore"):
        for op, fn in (("Exp", np.exp), ("Tanh", np.tanh)):
            got = run(drv, lambda t, op=op: K.xpu_unary(op, t), x)
            want = fn(x)
            np.testing.assert_allclose(got[:4], want[:4], rtol=0)  # inf, nan exactly
            assert abs(got[4] - want[4]) < np.finfo(np.float32).tiny  # exp: 0 for a subnormal
            assert np.isfinite(got[6])


@pytest.mark.parametrize(
    "sa,sb",
    [((300, 301), (301,)), ((301,), (300, 301)), ((257, 263), ()), ((33, 1, 129), (7, 1)),
     ((2, 3, 4100), (2, 3, 4100)), ((70001,), (70001,))],
)  # fmt: skip
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_binary_fast_paths_match_numpy(drv, threads, sa, sb, op):
    rng = np.random.default_rng(sum(sa) + len(op))
    a = rng.standard_normal(sa).astype(np.float32)
    b = (rng.standard_normal(sb) + 3).astype(np.float32)
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
          "Max": np.maximum, "Min": np.minimum}[op]  # fmt: skip
    got = run(drv, lambda x, y: K.xpu_binary(op, x, y), a, b)
    np.testing.assert_array_equal(got, fn(a, b))  # one float32 operation: exact


def test_results_do_not_depend_on_the_thread_count(drv):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((77, 1999)).astype(np.float32)
    s = rng.standard_normal(1999).astype(np.float32)
    outs = []
    for n in (1, 2, 3):
        set_num_threads(n)
        try:
            outs.append(
                [
                    run(drv, lambda t: K.xpu_softmax(t, -1), x),
                    run(drv, lambda t, u: K.xpu_layer_norm(t, u, None, -1, 1e-5), x, s),
                    run(drv, lambda t: K.xpu_unary("Tanh", t), x),
                    run(drv, lambda t, u: K.xpu_binary("Mul", t, u), x, s),
                ]
            )
        finally:
            set_num_threads(None)
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("exponent", [2.0, 3.0, 2.5, -1.0])
@pytest.mark.parametrize("eshape", [(), (1,), (1, 1)])
def test_pow_by_a_scalar_matches_numpy(drv, threads, exponent, eshape):
    """x ** 2 and x ** 3 are products (within 2 ulp of powf), other exponents powf."""
    x = (np.random.default_rng(9).standard_normal((129, 1001)) * 3).astype(np.float32)
    e = np.full(eshape, exponent, np.float32)
    got = run(drv, lambda t, u: K.xpu_binary("Pow", t, u), x, e)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.power(x.astype(np.float64), exponent)
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)  # NaN where numpy has NaN
