"""The quantized ops' C (``native/qlinear.py``, ``kernels/_qproduct.py``): the same bits as
the numpy path they replace, exact integer products, and onnxruntime's results on seeded
random models (zero points not 0, rounding ties, saturation at both ends)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.kernels import _qproduct
from anychip.backends.cpu.kernels import op_contrib_quantize as cq
from anychip.backends.cpu.kernels import op_conv_integer as ci
from anychip.backends.cpu.kernels import op_quantize as oq
from anychip.backends.cpu.native import qlinear

pytestmark = pytest.mark.skipif(not qlinear.available(), reason="no C compiler here")
RNG = np.random.default_rng(53)


def _ints(dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape, dtype=dtype)


def _numpy_path(monkeypatch, fn, *args, **kw):
    """``fn`` with the C hidden: the numpy path it had before."""
    with monkeypatch.context() as m:
        m.setattr(qlinear, "_get", lambda: None)
        return fn(*args, **kw)


@pytest.mark.parametrize("adt", [np.uint8, np.int8])
@pytest.mark.parametrize("bdt", [np.int8, np.uint8])
@pytest.mark.parametrize("zps", ["none", "common", "per-row-and-column"])
def test_product_is_exact(adt, bdt, zps) -> None:
    m, k, n = 13, 67, 29  # odd sizes: the C's tails
    a, b = _ints(adt, (m, k)), _ints(bdt, (k, n))
    za = zb = None
    if zps == "common":
        za, zb = np.array(_ints(adt, ())), np.array(_ints(bdt, ()))
    elif zps == "per-row-and-column":
        za, zb = _ints(adt, (m,)), _ints(bdt, (n,))
    y = qlinear.Product(qlinear.centered(b, zb), n, 0)(a, za)
    zam = 0 if za is None else np.asarray(za, np.int64).reshape(-1, 1) if zps != "common" else za
    want = (a.astype(np.int64) - np.asarray(zam, np.int64)) @ (
        b.astype(np.int64) - (0 if zb is None else np.asarray(zb, np.int64))
    )
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("shape", [(16, 32, 64), (3, 5, 40, 24), (64, 512, 96)])
@pytest.mark.parametrize("ydt", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_same_bits_as_numpy(monkeypatch, shape, ydt, per_column) -> None:
    """Both sides of ``C_MAX_MACS`` (the last shape: oneDNN's product where it is exact)."""
    *lead, k, n = shape
    assert (np.prod(shape) > _qproduct.C_MAX_MACS) == (shape[0] == 64)
    a, b = _ints(np.uint8, (*lead, k)), _ints(np.int8, (k, n))
    sb = RNG.uniform(0.001, 0.01, n if per_column else ()).astype(np.float32)
    args = (
        a, np.array(0.02, np.float32), np.array(121, np.uint8), b, sb,
        np.zeros(n if per_column else (), np.int8), np.array(sb.mean() * k**0.5, np.float32),
        np.array(7 if ydt is np.int8 else 131, ydt),
    )  # fmt: skip
    got = ci.qlinear_mat_mul(None, *args)
    want = _numpy_path(monkeypatch, ci.qlinear_mat_mul, None, *args)
    assert got.dtype == want.dtype == ydt
    np.testing.assert_array_equal(got, want)
    info = np.iinfo(ydt)
    assert (got == info.min).any() and (got == info.max).any()  # saturated both ways


def test_qgemm_and_matmul_integer_same_bits_as_numpy(monkeypatch) -> None:
    a, b = _ints(np.int8, (16, 48)), _ints(np.int8, (24, 48))
    c = RNG.integers(-5000, 5000, 24).astype(np.int32)
    common = (a, np.array(0.03, np.float32), np.array(-3, np.int8), b)
    scales = (RNG.uniform(0.001, 0.01, 24).astype(np.float32), np.zeros(24, np.int8), c)
    for y in ((), (np.array(0.2, np.float32), np.array(10, np.int8))):
        kw = dict(alpha=0.5, transB=1)
        got = cq.qgemm(None, *common, *scales, *y, **kw)
        want = _numpy_path(monkeypatch, cq.qgemm, None, *common, *scales, *y, **kw)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    au, bu = _ints(np.uint8, (2, 16, 40)), _ints(np.uint8, (40, 20))
    zs = (np.array(100, np.uint8), _ints(np.uint8, (20,)))
    got = ci.mat_mul_integer(None, au, bu, *zs)
    np.testing.assert_array_equal(
        got, _numpy_path(monkeypatch, ci.mat_mul_integer, None, au, bu, *zs)
    )


def test_elementwise_ops_same_bits_as_numpy(monkeypatch) -> None:
    s = np.array(0.1, np.float32)
    x = RNG.standard_normal((16, 64)).astype(np.float32) * 20
    x[0, :8] = (np.arange(8) + 0.5) * s  # exact ties: half to even
    for zp in (np.array(128, np.uint8), np.array(-5, np.int8), None):
        got = oq.quantize_linear(x, s, zp)
        np.testing.assert_array_equal(got, _numpy_path(monkeypatch, oq.quantize_linear, x, s, zp))
        back = oq.dequantize_linear(got, s, zp)
        np.testing.assert_array_equal(
            back, _numpy_path(monkeypatch, oq.dequantize_linear, got, s, zp)
        )
    for y in (x, np.zeros((3, 4), np.float32), np.abs(x)):
        got = oq.dynamic_quantize_linear(y)
        want = _numpy_path(monkeypatch, oq.dynamic_quantize_linear, y)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    a, b = _ints(np.uint8, (2, 16, 64)), _ints(np.uint8, (64,))
    p = (np.array(0.05, np.float32), np.array(120, np.uint8))
    q = (np.array(0.02, np.float32), np.array(3, np.uint8))
    for fn in (cq.qlinear_add, cq.qlinear_mul):
        for args in ((a, *p, b, *q), (b, *q, a, *p)):  # the bias on either side
            got = fn(*args, np.array(0.07, np.float32), np.array(128, np.uint8))
            want = _numpy_path(
                monkeypatch, fn, *args, np.array(0.07, np.float32), np.array(128, np.uint8)
            )
            np.testing.assert_array_equal(got, want)


def test_nan_and_other_forms_keep_the_numpy_path() -> None:
    x = np.array([np.nan, 1.0], np.float32)
    assert qlinear.quantize(x, np.array(0.1, np.float32), np.array(3, np.uint8)) is None
    assert qlinear.dynamic_quantize(x) is None
    per_axis = np.array([0.1, 0.2], np.float32)
    assert qlinear.quantize(np.ones((2, 2), np.float32), per_axis, None) is None
    assert qlinear.centered(np.ones((2, 2), np.int16), None) is None


def _qlinear_model(k: int, n: int, b: np.ndarray, scalars: dict) -> bytes:
    inits = [numpy_helper.from_array(v, name) for name, v in scalars.items()]
    inits.append(numpy_helper.from_array(b, "b"))
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
    graph = helper.make_graph(
        [node], "q", [helper.make_tensor_value_info("a", TensorProto.UINT8, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, ["m", n])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_small_qlinear_matmul_against_onnxruntime(monkeypatch) -> None:
    """A 16 x 32 x 64 product (the wild corpus' MLP): through the C, within one step of
    onnxruntime (which rounds its scale in float32), equal on nearly every element; the
    numpy path is never entered."""
    b = _ints(np.int8, (32, 64))
    scalars = {
        "sa": np.array(0.02, np.float32), "za": np.array(117, np.uint8),
        "sb": np.array(0.01, np.float32), "zb": np.array(0, np.int8),
        "sy": np.array(0.04, np.float32), "zy": np.array(140, np.uint8),
    }  # fmt: skip
    model = _qlinear_model(32, 64, b, scalars)
    a = _ints(np.uint8, (16, 32))
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    calls = []
    real = _qproduct.run_product
    monkeypatch.setattr(ci, "run_product", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(ci, "_integer_matmul", lambda *a: pytest.fail("numpy path taken"))
    sess = anychip.load(model, ["cpu"])
    (got,) = sess.run(None, {"a": a})
    (again,) = sess.run(None, {"a": a})  # the node's kept Product
    assert calls and got.dtype == np.uint8
    np.testing.assert_array_equal(again, got)
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    assert (got == 0).any() and (got == 255).any()


def test_rounding_ties_match_onnxruntime_exactly() -> None:
    """Scales of powers of two: every ``acc * scale / ys`` is exact in float32 and float64,
    half the sums odd, so ties to even decide; onnxruntime and anychip agree bit for bit."""
    b = _ints(np.int8, (32, 8))
    scalars = {
        "sa": np.array(0.5, np.float32), "za": np.array(9, np.uint8),
        "sb": np.array(0.25, np.float32), "zb": np.array(0, np.int8),
        "sy": np.array(4.0, np.float32), "zy": np.array(128, np.uint8),
    }  # fmt: skip
    model = _qlinear_model(32, 8, b, scalars)
    a = _ints(np.uint8, (16, 32))
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    (got,) = anychip.load(model, ["cpu"]).run(None, {"a": a})
    acc = (a.astype(np.int64) - 9) @ b.astype(np.int64)
    assert ((acc % 32) == 16).any()  # some exact ties (acc / 32 = x.5)
    np.testing.assert_array_equal(got, want)


def test_unary_tables_are_kept_per_parameters() -> None:
    x = _ints(np.uint8, (4, 50))
    s1, s2 = np.array(0.05, np.float32), np.array(0.07, np.float32)
    z = np.array(128, np.uint8)
    cq._TABLES.clear()
    first = cq.qlinear_sigmoid(None, x, s1, z, np.array(1 / 256, np.float32), np.array(0, np.uint8))
    other = cq.qlinear_sigmoid(None, x, s2, z, np.array(1 / 256, np.float32), np.array(0, np.uint8))
    leaky = cq.qlinear_leaky_relu(None, x, s1, z, s1, z, alpha=0.2)
    assert len(cq._TABLES) == 3 and not np.array_equal(first, other)
    again = cq.qlinear_sigmoid(None, x, s1, z, np.array(1 / 256, np.float32), np.array(0, np.uint8))
    np.testing.assert_array_equal(again, first)
    v = (x.astype(np.float32) - 128) * s1
    want = np.clip(np.rint(np.where(v >= 0, v, v * np.float32(0.2)) / s1) + 128, 0, 255)
    np.testing.assert_array_equal(leaky, want.astype(np.uint8))


def test_lookup_indexes_int8_from_minus_128() -> None:
    table = _ints(np.uint8, (256,))
    for dt in (np.int8, np.uint8):
        x = _ints(dt, (3, 70))
        want = table[x.astype(np.int64) - np.iinfo(dt).min]
        np.testing.assert_array_equal(qlinear.lookup(x, table), want)
    assert qlinear.lookup(_ints(np.uint8, (4,)), table[:10]) is None
