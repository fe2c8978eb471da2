"""The generated channel shuffle (``backends/cpu/native/copies.py``) against the numpy kernel it
stands in
for, bit for bit on seeded random inputs with NaN (with payloads), +-Inf and -0.0, over shapes
whose channels and planes are and are not multiples of the 8x8 tile; on the pool's threads
equal to one thread; refusals; None with the compiler hidden."""

from __future__ import annotations

import numpy as np
import pytest

import anychip.backends.cpu.native.fused as cg
from anychip.backends.cpu.kernels.op_channel_shuffle import channel_shuffle
from anychip.backends.cpu.native import copies, omp
from anychip.codegen import build

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="needs a C compiler (gcc)")

SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-40, 3e38], np.float32)
#: (batch, channels, height, width, groups)
CASES = [
    (1, 16, 10, 10, 4),
    (1, 112, 9, 7, 4),
    (2, 24, 5, 7, 3),
    (1, 10, 3, 3, 2),
    (3, 15, 9, 1, 5),
    (1, 12, 1, 1, 6),
    (1, 8, 4, 4, 1),
    (1, 64, 2, 8, 8),
]


def _input(n: int, c: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, size=min(flat.size, 3 * SPECIALS.size), replace=False)
    flat[idx] = np.resize(SPECIALS, idx.size)
    flat.view(np.uint32)[idx[:1]] = 0x7FC00123  # a NaN with a payload: copied as bits
    return x


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(
        np.ascontiguousarray(got).view(np.uint32), np.ascontiguousarray(want).view(np.uint32)
    )


@pytest.mark.parametrize("n, c, h, w, g", CASES)
def test_shuffle_matches_the_numpy_kernel_bit_for_bit(n, c, h, w, g):
    x = _input(n, c, h, w)
    y = copies.shuffle_channels_last(x, g)
    assert y is not None
    assert y.transpose(0, 2, 3, 1).flags.c_contiguous  # the NCHW view of an NHWC buffer
    _same_bits(y, channel_shuffle(x, group=g))


@pytest.fixture
def two_threads(monkeypatch):
    """Two OpenMP threads and every call on the pool (the threshold at zero)."""
    if not omp.available():
        pytest.skip("libgomp is not loadable")
    kept = omp.max_threads()
    omp.set_threads(2)
    monkeypatch.setattr(cg, "PARALLEL_WORK", 0)
    yield
    omp.set_threads(kept)


@pytest.mark.parametrize("n, c, h, w, g", CASES + [(1, 112, 56, 56, 4), (2, 136, 28, 28, 4)])
def test_on_the_pool_equals_one_thread(two_threads, monkeypatch, n, c, h, w, g):
    x = _input(n, c, h, w, seed=3)
    threaded = copies.shuffle_channels_last(x, g)
    with monkeypatch.context() as mp:
        mp.setattr(cg, "PARALLEL_WORK", 1 << 62)
        serial = copies.shuffle_channels_last(x, g)
    _same_bits(threaded, serial)
    _same_bits(threaded, channel_shuffle(x, group=g))


def test_refuses_what_it_does_not_run():
    x = _input(1, 12, 3, 3)
    assert copies.shuffle_channels_last(x.astype(np.float64), 3) is None
    assert copies.shuffle_channels_last(x[:, :, :, ::-1], 3) is None  # not C-contiguous
    assert copies.shuffle_channels_last(x, 5) is None
    assert copies.shuffle_channels_last(x, 0) is None
    assert copies.shuffle_channels_last(x[0], 3) is None
    assert copies.shuffle_channels_last(np.zeros((1, 12, 0, 3), np.float32), 3) is None


def test_without_a_compiler_it_declines(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    copies.forget()
    try:
        assert copies.shuffle_channels_last(_input(1, 16, 4, 4), 4) is None
    finally:
        monkeypatch.delenv("CC")
        copies.forget()
    assert copies.shuffle_channels_last(_input(1, 16, 4, 4), 4) is not None


@pytest.mark.parametrize(
    "n, c, h, w", [(1, 64, 56, 56), (2, 13, 31, 29), (1, 24, 1, 400), (3, 9, 40, 8)]
)
def test_to_planar_matches_numpy_bit_for_bit(n, c, h, w):
    x = _input(n, c, h, w, seed=9)
    cl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    out = np.empty(x.shape, np.float32)
    assert copies.to_planar(cl, out)
    _same_bits(out, x)


def test_to_planar_refuses_what_it_does_not_run():
    x = _input(1, 16, 32, 32, seed=10)
    cl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    out = np.empty(x.shape, np.float32)
    assert not copies.to_planar(x, out)  # already planar: not a channels-last view
    assert not copies.to_planar(cl, out[:, :, :, ::-1])  # out not C-contiguous
    assert not copies.to_planar(cl, np.empty((1, 16, 32, 31), np.float32))
    small = np.zeros((1, 4, 4, 4), np.float32).transpose(0, 3, 1, 2)
    assert small.size < copies.PLANAR_MIN
    assert not copies.to_planar(small, np.empty(small.shape, np.float32))


def _cl(x: np.ndarray) -> np.ndarray:
    """``x`` as the NCHW view of a new channels-last buffer."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


@pytest.mark.parametrize(
    "n, widths, h, w",
    [
        (1, (64, 64), 55, 55),
        (2, (5, 13, 7), 9, 11),
        (1, (3, 1), 40, 40),
        (1, (16, 48, 8, 24), 28, 28),
    ],
)
def test_concat_on_the_pool_matches_numpy_bit_for_bit(two_threads, n, widths, h, w):
    xs = [_cl(_input(n, c, h, w, seed=20 + i)) for i, c in enumerate(widths)]
    y = np.empty((n, h, w, sum(widths)), np.float32).transpose(0, 3, 1, 2)
    y[...] = 7.0  # every element must be written over
    assert copies.concat_channels_last(xs, y)
    _same_bits(y, np.concatenate(xs, axis=1))


def test_concat_declines_one_thread_and_what_it_does_not_run(two_threads, monkeypatch):
    xs = [_cl(_input(1, c, 6, 6, seed=c)) for c in (4, 12)]
    y = np.empty((1, 6, 6, 16), np.float32).transpose(0, 3, 1, 2)
    with monkeypatch.context() as mp:  # under the threshold numpy's copy is as fast
        mp.setattr(cg, "PARALLEL_WORK", 1 << 62)
        assert not copies.concat_channels_last(xs, y)
    assert not copies.concat_channels_last([xs[0], np.ascontiguousarray(xs[1])], y)  # planar
    assert not copies.concat_channels_last(xs, np.empty((1, 16, 6, 6), np.float32))
    assert not copies.concat_channels_last(xs[:1], y)  # widths do not add up
    wide = np.empty((1, 6, 7, 16), np.float32).transpose(0, 3, 1, 2)
    assert not copies.concat_channels_last(xs, wide)  # another plane
    assert copies.concat_channels_last(xs, y)
