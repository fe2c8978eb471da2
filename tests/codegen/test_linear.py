"""``backends/cpu/native/linear.py``: ``A @ B + bias`` as numpy's sgemm and a C bias loop, equal to
``np.matmul`` then ``np.add`` bit for bit on seeded random inputs (NaN and Inf included);
declined where numpy would compute other sums, where the output overlaps an input, and
without a compiler."""

from __future__ import annotations

import numpy as np
import pytest

from anychip.backends.cpu.kernels.op_matmul_add import matmul_add
from anychip.backends.cpu.native import linear
from anychip.codegen import build

pytestmark = pytest.mark.skipif(
    build.compiler() is None or linear.sgemm_address() == 0,
    reason="needs a C compiler and numpy's ILP64 OpenBLAS",
)


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "a_shape, n, bias_shape",
    [((1, 128, 32), 32, (32,)), ((3, 5, 7), 9, (1, 9)), ((2, 3, 300), 500, (1, 1, 500))],
)
def test_linear_equals_numpy_bit_for_bit(a_shape, n, bias_shape):
    rng = np.random.default_rng(sum(a_shape) + n)
    a, b, c = _rand(rng, *a_shape), _rand(rng, a_shape[-1], n), _rand(rng, *bias_shape)
    a.reshape(-1)[[1, 7]] = [np.nan, np.inf]
    c.reshape(-1)[2] = -np.inf
    want = np.add(np.matmul(a, b), c)
    out = np.empty(want.shape, np.float32)
    got = linear.linear(a, b, c, out)
    assert got is out
    np.testing.assert_array_equal(got, want)  # NaN where NaN, bit for bit elsewhere
    np.testing.assert_array_equal(matmul_add(a, b, c), want)


@pytest.mark.parametrize(
    "a_shape, n",
    [((4,), 6), ((3, 1, 8), 6), ((5, 8), 1), ((0, 8), 4)],  # vector products, empty
)
def test_other_products_declined(a_shape, n):
    rng = np.random.default_rng(3)
    a, b, c = _rand(rng, *a_shape), _rand(rng, a_shape[-1], n), _rand(rng, n)
    assert linear.linear(a, b, c) is None
    np.testing.assert_allclose(matmul_add(a, b, c), np.matmul(a, b) + c, rtol=1e-6)


def test_an_output_over_an_input_is_declined():
    rng = np.random.default_rng(4)
    a, b, c = _rand(rng, 16, 8), _rand(rng, 8, 8), _rand(rng, 8)
    want = a @ b + c
    assert linear.linear(a, b, c, out=a) is None
    np.testing.assert_array_equal(a @ b + c, want)  # nothing written
    np.testing.assert_array_equal(matmul_add(a, b, c, out=a), want)


def test_float64_and_strided_inputs_go_to_numpy():
    rng = np.random.default_rng(5)
    a, b, c = _rand(rng, 6, 8), _rand(rng, 8, 4), _rand(rng, 4)
    assert linear.linear(a.astype(np.float64), b.astype(np.float64), c.astype(np.float64)) is None
    assert linear.linear(a[:, ::2], b[::2], c) is None


def test_without_a_compiler_numpy_runs(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/anychip-no-cc")
    rng = np.random.default_rng(6)
    a, b, c = _rand(rng, 6, 8), _rand(rng, 8, 4), _rand(rng, 4)
    assert linear.linear(a, b, c) is None
    np.testing.assert_array_equal(matmul_add(a, b, c), np.add(np.matmul(a, b), c))
