"""The C row kernels (``backends/cpu/native/rows.py``) against the numpy kernels they replace, on
seeded
random inputs with NaN, +-Inf and masks of several broadcast shapes; the numpy fallback with
the compiler hidden."""

from __future__ import annotations

import numpy as np
import pytest

from anychip.backends.cpu.kernels.op_fused_attention import _scaled_softmax, fused_attention
from anychip.backends.cpu.kernels.op_layer_normalization import layer_normalization
from anychip.backends.cpu.kernels.op_softmax import softmax
from anychip.backends.cpu.native import rows
from anychip.codegen import build

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="needs a C compiler (gcc)")

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e38, -3e38, 88.8, -104.5]


def _specials(rng: np.random.Generator, x: np.ndarray, count: int) -> np.ndarray:
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, size=min(flat.size, count), replace=False)
    flat[idx] = np.resize(np.array(SPECIALS, x.dtype), idx.size)
    return x


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN positions differ"
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=2e-6, atol=1e-9)


def _numpy(fn, *args, **kw):
    """``fn`` run with the compiler hidden: the numpy kernels' own steps."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CC", "/nonexistent/cc")
        return fn(*args, **kw)


@pytest.fixture
def no_compiler(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    rows.forget()
    yield
    monkeypatch.delenv("CC")
    rows.forget()


SHAPES = [(7,), (3, 5), (2, 3, 130), (1, 2, 128, 128), (4, 1000), (2, 2, 3, 300)]


@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_rows_match_numpy_with_nan_and_inf(shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 6).astype(np.float32)
    x = _specials(rng, x, 4)  # a few rows get a NaN or an infinity, the rest stay finite
    want = _numpy(_scaled_softmax, x.copy(), None, 1.0, 0)
    got = np.empty_like(x)
    assert rows.softmax_rows(x, got)
    _close(got, want)
    assert np.isnan(got).any() or not np.isnan(x).any()


MASKS = [(1, 1, 16, 24), (1, 1, 1, 24), (2, 1, 16, 24), (16, 24), (24,), (1, 3, 16, 1)]


@pytest.mark.parametrize("mshape", MASKS)
@pytest.mark.parametrize("divide", [1, 0])
def test_attention_scores_in_c_match_numpy(mshape, divide):
    rng = np.random.default_rng(len(mshape) * 10 + divide)
    s = (rng.standard_normal((2, 3, 16, 24)) * 4).astype(np.float32)
    mask = rng.standard_normal(mshape).astype(np.float32)
    mask.reshape(-1)[::5] = -np.inf  # causal-style masked positions
    s = _specials(rng, s, 3)
    want = _numpy(_scaled_softmax, s.copy(), mask, 0.25 if divide else 4.0, divide)
    got = s.copy()
    assert rows.softmax_rows(got, got, mask, 0.25 if divide else 4.0, 1 if divide else 2)
    _close(got, want)


def test_softmax_exp_over_its_whole_range_matches_numpy():
    """Rows spread from their max down past exp's underflow (x - max to -120: the
    denormals and the zeros of ``ac_expf_le0``), shuffled, with -inf, NaN and all -inf rows."""
    rng = np.random.default_rng(7)
    x = np.linspace(0.0, -120.0, 40 * 96, dtype=np.float32).reshape(40, 96)
    x = rng.permuted(x, axis=1) + rng.standard_normal((40, 1)).astype(np.float32) * 30
    x[3, ::4], x[5, 7], x[6] = -np.inf, np.nan, -np.inf
    want = _numpy(_scaled_softmax, x.copy(), None, 1.0, 1)
    got = x.copy()
    assert rows.softmax_rows(got, got, None, 1.0, 1)
    _close(got, want)
    assert (got[:, :] < 1e-38).any() and (got == 0).any()  # the range was covered


@pytest.mark.parametrize("step", [2, 3])
def test_strided_mask_views_match_numpy(step):
    """A mask that is a strided view (not C-contiguous) reads through its own strides; one
    that does not broadcast leaves the softmax to numpy."""
    rng = np.random.default_rng(step)
    s = (rng.standard_normal((2, 3, 16, 24)) * 4).astype(np.float32)
    base = rng.standard_normal((2, 1, 16 * step, 24 * step)).astype(np.float32)
    mask = base[:, :, ::step, ::step]
    assert not mask.flags.c_contiguous
    want = _numpy(_scaled_softmax, s.copy(), mask, 0.25, 1)
    got = s.copy()
    assert rows.softmax_rows(got, got, mask, 0.25, 1)
    _close(got, want)
    assert not rows.softmax_rows(got, got, base[:, :, :5, :24], 0.25, 1)


def test_fused_attention_c_against_numpy_steps():
    rng = np.random.default_rng(3)
    q, kt, v = (rng.standard_normal(sh).astype(np.float32) for sh in
                [(1, 2, 128, 16), (1, 2, 16, 128), (1, 2, 128, 16)])  # fmt: skip
    mask = np.where(rng.random((1, 1, 128, 128)) < 0.2, -np.inf, 0.0).astype(np.float32)
    want = np.matmul(_numpy(_scaled_softmax, np.matmul(q, kt), mask, 4.0, 1), v)
    got = fused_attention(q, kt, v, mask, scale=4.0, divide=1)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)


def test_softmax_kernel_without_compiler_is_numpy(no_compiler):
    x = np.random.default_rng(1).standard_normal((4, 33)).astype(np.float32)
    assert not rows.softmax_rows(x, np.empty_like(x))
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_array_equal(softmax(x), e / e.sum(-1, keepdims=True))


def test_softmax_rows_refuse_what_they_do_not_run():
    x = np.ones((2, 3, 4, 5, 6), np.float32)
    assert not rows.softmax_rows(x, np.empty_like(x))  # rank 5
    x = np.ones((4, 6), np.float64)
    assert not rows.softmax_rows(x, np.empty_like(x))
    x = np.ones((4, 6), np.float32)
    assert not rows.softmax_rows(x, np.empty_like(x), np.ones((3, 6), np.float32))
    assert not rows.softmax_rows(x.T, np.empty((6, 4), np.float32))  # not C-contiguous


@pytest.mark.parametrize("shape,axis", [((128, 32), 1), ((1, 128, 32), -1), ((2, 3, 130), 1),
                                        ((3, 300), 1), ((5, 7), 0), ((2, 9, 4), -1)])  # fmt: skip
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_bit_identical_to_numpy_steps(shape, axis, with_bias):
    rng = np.random.default_rng(len(shape) + axis)
    x = _specials(rng, (rng.standard_normal(shape) * 3 + 1).astype(np.float32), 2)
    norm = shape[axis:]
    scale = rng.standard_normal(norm).astype(np.float32)
    bias = rng.standard_normal(norm).astype(np.float32) if with_bias else None
    got = layer_normalization(x, scale, bias, axis=axis, epsilon=1e-5)
    want = _numpy(layer_normalization, x, scale, bias, axis=axis, epsilon=1e-5)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)  # NaN where NaN, bit for bit elsewhere


@pytest.mark.parametrize("scale", [8.0, 0.125, 2.0**-125])
def test_division_by_a_power_of_two_is_bit_identical(scale):
    """``exact_op`` turns ``x / scale`` into ``x * (1 / scale)``: the softmax equals the one
    of scores numpy divided first, bit for bit (denormal quotients included)."""
    rng = np.random.default_rng(11)
    s = (rng.standard_normal((2, 3, 16, 40)) * 4).astype(np.float32)
    s[0, 0, 0, :8] = np.float32(1.5e-38) * np.arange(1, 9, dtype=np.float32)  # denormal / 8
    s = _specials(rng, s, 3)
    assert rows.exact_op(scale, 1) == (1.0 / scale, 2)
    assert rows.exact_op(3.0, 1) == (3.0, 1) and rows.exact_op(4.0, 2) == (4.0, 2)
    want = np.divide(s, np.float32(scale))
    assert rows.softmax_rows(want, want, None, 1.0, 0)
    got = s.copy()
    assert rows.softmax_rows(got, got, None, scale, 1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, with_bias", [((2, 5, 32), True), ((3, 130), False), ((7,), True)])
def test_skip_layer_norm_rows_bit_identical_to_add_then_numpy_steps(shape, with_bias):
    rng = np.random.default_rng(sum(shape))
    x = _specials(rng, (rng.standard_normal(shape) * 3 + 1).astype(np.float32), 2)
    skip = _specials(rng, rng.standard_normal(shape).astype(np.float32), 2)
    scale = rng.standard_normal(shape[-1:]).astype(np.float32)
    bias = rng.standard_normal(shape[-1:]).astype(np.float32) if with_bias else None
    got = rows.skip_layer_norm_rows(x, skip, scale, bias, 1e-12)
    assert got is not None
    total = x + skip
    want = _numpy(layer_normalization, total, scale, bias, axis=-1, epsilon=1e-12)
    for g, w in zip(got, want + (total,)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)  # NaN where NaN, bit for bit elsewhere


def test_skip_layer_norm_rows_declines_other_shapes_and_without_a_compiler(no_compiler):
    x = np.ones((2, 8), np.float32)
    assert rows.skip_layer_norm_rows(x, np.ones((2, 8), np.float32), x[0], None, 1e-5) is None


def test_skip_layer_norm_rows_declines_a_broadcast_skip():
    x = np.ones((2, 8), np.float32)
    assert rows.skip_layer_norm_rows(x, np.ones((1, 8), np.float32), x[0], None, 1e-5) is None


@pytest.mark.parametrize("stats, total", [(False, False), (True, False), (False, True)])
def test_skip_layer_norm_rows_leaves_out_what_is_not_asked(stats, total):
    """Without the sum's own buffer the sum is formed in Y's rows: Y is the same bits."""
    rng = np.random.default_rng(5)
    x = _specials(rng, rng.standard_normal((3, 9, 24)).astype(np.float32), 3)
    skip = rng.standard_normal((3, 9, 24)).astype(np.float32)
    scale, bias = rng.standard_normal((2, 24)).astype(np.float32)
    full = rows.skip_layer_norm_rows(x, skip, scale, bias, 1e-12)
    lean = rows.skip_layer_norm_rows(x, skip, scale, bias, 1e-12, stats=stats, total=total)
    np.testing.assert_array_equal(lean[0], full[0])
    for got, want, kept in zip(lean[1:], full[1:], (stats, stats, total)):
        assert got is None if not kept else np.array_equal(got, want, equal_nan=True)


def test_layer_norm_rows_rebinds_a_new_scale_array():
    """The scale and bias pointers are kept per array: another array (even at the same id,
    once the first is gone) is bound anew, and an array changed in place is read as it is."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    for seed in range(4):
        scale, bias = np.random.default_rng(seed).standard_normal((2, 16)).astype(np.float32)
        y, mean, inv = rows.layer_norm_rows(x, scale, bias, 1e-5, 1, stats=False)
        assert mean is None and inv is None
        want = _numpy(layer_normalization, x, scale, bias, axis=1, epsilon=1e-5)[0]
        np.testing.assert_array_equal(y, want)
        scale *= 2  # in place: the kept pointer reads the new values
        y2 = rows.layer_norm_rows(x, scale, bias, 1e-5, 1)[0]
        np.testing.assert_array_equal(y2, _numpy(layer_normalization, x, scale, bias, axis=1,
                                                 epsilon=1e-5)[0])  # fmt: skip


def test_kept_pointers_evicted_from_several_threads_at_once():
    """Four threads each bind hundreds of fresh scale arrays (more than are kept): evicting
    the oldest from several threads at once raises nothing and every result is right."""
    from concurrent.futures import ThreadPoolExecutor

    x = np.random.default_rng(9).standard_normal((3, 16)).astype(np.float32)

    def work(seed: int) -> bool:
        rng = np.random.default_rng(seed)
        for _ in range(150):
            scale = rng.standard_normal(16).astype(np.float32)
            y = rows.layer_norm_rows(x, scale, None, 1e-5, 1, stats=False)[0]
            mu = x.mean(axis=1, keepdims=True)
            want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5) * scale
            if not np.allclose(y, want, rtol=1e-5, atol=1e-5):
                return False
        return True

    with ThreadPoolExecutor(4) as ex:
        assert all(ex.map(work, range(4)))
