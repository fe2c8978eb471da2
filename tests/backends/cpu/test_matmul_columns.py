"""MatMul and Gemm by column blocks of numpy's sgemm on the pool's threads
(``onednn/matmul.split_columns``, ``cpu/native/linear.gemm_columns``): given two threads, a
constant-weight product of ``MIN_ROWS`` rows or more and from ``MIN_MACS`` to under
``COLUMN_SPLIT_MAX`` multiply-adds goes
there, equal to numpy's product bit for bit (MatMul) and to onnxruntime (Gemm with transB);
one thread, larger products and an output over an input stay with oneDNN or numpy."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.native import linear, omp
from anychip.backends.cpu.onednn import matmul
from anychip.codegen import build
from tests.backends.cpu.test_onednn_threads import two_threads

pytestmark = pytest.mark.skipif(
    build.compiler() is None or linear.sgemm_address() == 0,
    reason="needs a C compiler and numpy's ILP64 OpenBLAS",
)


@pytest.fixture
def calls(monkeypatch):
    """The column split's calls, counted."""
    seen = []
    real = matmul.gemm_columns

    def spy(*args, **kw):
        seen.append(args[0].shape)
        return real(*args, **kw)

    monkeypatch.setattr(matmul, "gemm_columns", spy)
    return seen


def _model(a_shape, b, gemm_trans_b=False):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(a_shape))
    n = b.shape[0] if gemm_trans_b else b.shape[1]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(a_shape[:-1]) + [n])
    if gemm_trans_b:
        node = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    else:
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    g = helper.make_graph([node], "mm", [x], [y], [numpy_helper.from_array(b, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_mid_sized_matmul_split_equals_numpy(monkeypatch, calls):
    a, b = _rand(1, 1, 128, 256), _rand(2, 256, 256)  # 2^23 multiply-adds
    a[0, 3, 7] = np.nan
    with two_threads(monkeypatch):
        got = anychip.load(_model(a.shape, b), "cpu").run(None, {"x": a})[0]
    assert calls == [(1, 128, 256)]
    np.testing.assert_array_equal(got, np.matmul(a, b))  # the same sgemm: bit for bit


def test_gemm_trans_b_split_equals_onnxruntime(monkeypatch, calls):
    a, b = _rand(3, 96, 320), _rand(4, 200, 320)  # 6.1M multiply-adds, n = 200 (not of 16)
    m = _model(a.shape, b, gemm_trans_b=True)
    with two_threads(monkeypatch):
        got = anychip.load(m, "cpu").run(None, {"x": a})[0]
    assert calls == [(96, 320)]
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": a})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_one_thread_and_large_products_not_split(monkeypatch, calls):
    a, b = _rand(5, 1, 128, 256), _rand(6, 256, 256)
    monkeypatch.setattr(matmul, "COLUMN_SPLIT_MAX", 1 << 23)  # 2^23 is now over it
    with two_threads(monkeypatch):
        got = anychip.load(_model(a.shape, b), "cpu").run(None, {"x": a})[0]
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
    monkeypatch.setattr(matmul, "COLUMN_SPLIT_MAX", 1 << 26)
    kept = omp.max_threads()
    omp.set_threads(1)
    try:
        got = anychip.load(_model(a.shape, b), "cpu").run(None, {"x": a})[0]
    finally:
        omp.set_threads(kept)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
    assert calls == []


def test_gemm_columns_refuses_an_output_over_an_input(blas_one):
    from anychip.core.run.blas import openblas_threads

    a, b = _rand(7, 64, 64), _rand(8, 64, 64)
    want = a @ b
    assert linear.gemm_columns(a, b, a, False, 2) is None
    np.testing.assert_array_equal(a @ b, want)  # nothing written
    np.testing.assert_array_equal(linear.gemm_columns(a, b, None, False, 2), want)
    openblas_threads()[1](2)
    assert linear.gemm_columns(a, b, None, False, 2) is None  # OpenBLAS's own threads


@pytest.fixture
def blas_one():
    """numpy's OpenBLAS at one thread, as inside a CPU partition's run."""
    from anychip.core.run.blas import openblas_threads

    get, put = openblas_threads()
    kept = get()
    put(1)
    yield
    put(kept)


def test_few_rows_not_split(monkeypatch, calls, blas_one):
    a, b = _rand(9, 8, 2048), _rand(10, 2048, 256)  # 4.2M multiply-adds over 8 rows
    with two_threads(monkeypatch):
        assert matmul.split_columns(a, b, None) is None
        assert matmul.split_columns(_rand(11, 16, 1024), b[:1024], None) is not None
    assert calls == [(16, 1024)]


@pytest.fixture
def gemv_calls(monkeypatch):
    """The streaming matrix-vector product's calls: the weights' shape and the parts."""
    seen = []
    real = matmul.gemv

    def spy(*args, **kw):
        seen.append((args[1].shape, args[4]))
        return real(*args, **kw)

    monkeypatch.setattr(matmul, "gemv", spy)
    return seen


@pytest.mark.parametrize("trans_b", [True, False])
def test_batch_one_classifier_split_over_threads(monkeypatch, gemv_calls, trans_b):
    """A batch-1 Gemm (transB) or MatMul over ``GEMV_SPLIT_WEIGHTS`` weights streams them in
    two blocks on the pool (``backends/cpu/native/gemv.py``): onnxruntime's result, a NaN carried
    to the
    outputs."""
    a = _rand(7, 1, 1024)
    b = _rand(8, 1000, 1024) * 0.05 if trans_b else _rand(8, 1024, 1000) * 0.05
    m = _model(a.shape, b, gemm_trans_b=trans_b)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    with two_threads(monkeypatch):
        # On the threads given: the thread choice would run the second run on one thread.
        sess = anychip.load(m, "cpu", device_options={"cpu": {"thread_choice": False}})
        got = sess.run(None, {"x": a})[0]
        bad = a.copy()
        bad[0, 5] = np.nan  # every output reads it
        got_nan = sess.run(None, {"x": bad})[0]
    assert gemv_calls == [(b.shape, 2), (b.shape, 2)]
    np.testing.assert_allclose(got, ref.run(None, {"x": a})[0], rtol=1e-5, atol=1e-5)
    assert np.isnan(got_nan).all() and np.isnan(ref.run(None, {"x": bad})[0]).all()


@pytest.mark.parametrize("trans_b", [True, False])
def test_batch_one_product_streams_on_one_thread_from_gemv_weights(
    monkeypatch, gemv_calls, trans_b
):
    """At one thread a one-row product over ``GEMV_WEIGHTS`` weights (lowered here: VGG's
    fc6 is 100M) streams them in one part; a smaller one stays numpy's. Both equal
    onnxruntime's."""
    monkeypatch.setattr(matmul, "GEMV_WEIGHTS", 1 << 16)
    monkeypatch.setattr(matmul, "GEMV_SPLIT_WEIGHTS", 1 << 10)
    kept = omp.max_threads()
    omp.set_threads(1)
    try:
        for n, k, streams in ((300, 256, True), (60, 256, False)):
            a = _rand(12, 1, k)
            b = _rand(13, n, k) * 0.05 if trans_b else _rand(13, k, n) * 0.05
            assert (b.size >= matmul.GEMV_WEIGHTS) is streams
            m = _model(a.shape, b, gemm_trans_b=trans_b)
            ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
            gemv_calls.clear()
            got = anychip.load(m, "cpu").run(None, {"x": a})[0]
            assert gemv_calls == ([(b.shape, 1)] if streams else [])
            np.testing.assert_allclose(got, ref.run(None, {"x": a})[0], rtol=1e-5, atol=1e-5)
    finally:
        omp.set_threads(kept)
