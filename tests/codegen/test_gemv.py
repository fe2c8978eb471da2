"""``backends/cpu/native/gemv.py``: one row times a weight matrix, streamed in C, against float64
numpy on
seeded random data, both weight layouts, every remainder of the 16-wide and 4-row loops, one
to three parts on the pool, NaN and infinities, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from anychip.backends.cpu.native import omp
from anychip.backends.cpu.native.gemv import gemv
from anychip.codegen import build

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="needs a C compiler (gcc)")


def _rand(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _want(x: np.ndarray, w: np.ndarray, trans_b: bool) -> np.ndarray:
    w64 = w.astype(np.float64)
    return x.astype(np.float64) @ (w64.T if trans_b else w64)


@pytest.mark.parametrize("trans_b", [True, False])
@pytest.mark.parametrize(("n", "k"), [(1000, 544), (37, 53), (3, 7), (16, 1), (1, 300)])
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_equals_float64_numpy(trans_b, n, k, parts):
    x = _rand(n + k, 1, k)
    w = _rand(n * k, n, k) if trans_b else _rand(n * k, k, n)
    kept = omp.max_threads()
    omp.set_threads(2)
    try:
        got = gemv(x, w, None, trans_b, parts)
    finally:
        omp.set_threads(kept)
    assert got is not None and got.shape == (1, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, _want(x, w, trans_b), rtol=1e-5, atol=1e-5 * np.sqrt(k))


@pytest.mark.parametrize("trans_b", [True, False])
def test_nan_and_infinities_propagate(trans_b):
    n, k = 40, 70
    x, w = _rand(1, k), _rand(2, n, k) if trans_b else _rand(2, k, n)
    x[3] = np.nan
    got = gemv(x, w, None, trans_b, 2)
    assert got.shape == (n,) and np.isnan(got).all()
    x[3] = 1.0
    wi = w.copy()
    if trans_b:
        wi[5, 9], wi[6, 9], wi[7, 9] = np.inf, -np.inf, np.inf
    else:
        wi[9, 5], wi[9, 6], wi[9, 7] = np.inf, -np.inf, np.inf
    x[9] = 2.0
    got = gemv(x, wi, None, trans_b)
    assert got[5] == np.inf and got[6] == -np.inf and got[7] == np.inf
    finite = np.ones(n, bool)
    finite[5:8] = False
    np.testing.assert_allclose(got[finite], _want(x, wi, trans_b)[finite], rtol=1e-5, atol=1e-4)


def test_writes_into_out_and_takes_leading_ones():
    x, w = _rand(3, 1, 1, 64), _rand(4, 48, 64)
    out = np.full((1, 1, 48), 7.0, np.float32)
    assert gemv(x, w, out, True) is out
    np.testing.assert_allclose(out, _want(x, w, True), rtol=1e-5, atol=1e-5)
    wrong = np.empty((1, 48), np.float32)  # another shape: a new array
    assert gemv(x, w, wrong, True) is not wrong


def test_refuses_what_it_does_not_compute():
    x, w = _rand(5, 1, 64), _rand(6, 48, 64)
    assert gemv(_rand(7, 2, 64), w, None, True) is None  # two rows
    assert gemv(x.astype(np.float64), w, None, True) is None  # another dtype
    assert gemv(x, np.asfortranarray(w), None, True) is None  # weights not C-contiguous
    assert gemv(x, w, None, False) is None  # K does not match: 64 against 48
    assert gemv(_rand(8, 1, 0), np.zeros((48, 0), np.float32), None, True) is None  # empty
    both = np.zeros(64 + 48, np.float32)
    x_in = both[:64].reshape(1, 64)
    x_in[...] = x
    assert gemv(x_in, w, both[16 : 16 + 48].reshape(1, 48), True) is None  # out over x
