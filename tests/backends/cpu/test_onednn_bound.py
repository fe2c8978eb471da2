"""``Prim.run`` binding its buffers and executing in one C call (``_parallel.bound_runner``):
the same answers as binding each buffer from Python, for every kind of buffer it takes
(contiguous arrays, the NCHW view of a channels-last buffer, other strided arrays, addresses),
one primitive shared by two weight arrays in turn, and the Python path without the helper."""

from __future__ import annotations

import numpy as np
import pytest

from anychip.backends.cpu.kernels.op_conv import conv as numpy_conv
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn import _parallel as par
from anychip.backends.cpu.onednn._lib import C
from anychip.backends.cpu.onednn._prim import from_channels_last, ptr
from anychip.backends.cpu.onednn.conv import conv as onednn_conv

pytestmark = pytest.mark.skipif(not _lib.available(), reason="oneDNN is not loadable here")

ATTRS = {"pads": [1, 1, 1, 1]}


def _remembered(rng: np.random.Generator, memo: dict) -> tuple:
    """A channels-last 3x3 convolution run once, so its node remembers the primitive."""
    x = from_channels_last(rng.standard_normal((1, 7, 7, 8)).astype(np.float32))
    w = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    for _ in range(2):  # the second call runs the remembered path, which keeps the weights
        onednn_conv(x, w, b, None, None, ATTRS, channels_last=True, memo=memo)
    return x, w, b, memo["fast"]


def _want(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return numpy_conv(np.ascontiguousarray(x), w, b, **ATTRS)


def _run(fast, x_arg, w_arg, b_arg) -> np.ndarray:
    """The remembered primitive run on the given buffers; the output, NCHW."""
    ycl = np.full(fast.y_cl, np.nan, np.float32)
    fast.entry.prim.run({C.arg_src: x_arg, C.arg_weights: w_arg, C.arg_dst: ycl, C.arg_bias: b_arg})
    return from_channels_last(ycl)


def test_every_kind_of_buffer_binds_in_the_one_call() -> None:
    if par._helper() is None:
        pytest.skip("no C compiler: the one-call path is not built here")
    rng = np.random.default_rng(21)
    x, w, b, fast = _remembered(rng, {})
    wk = fast.wk
    assert wk is not None
    want = _want(x, w, b)
    assert fast.entry.prim.bound is not None and fast.entry.prim.bound[0] is not None
    # the NCHW view of a channels-last buffer, a contiguous array, an address
    np.testing.assert_allclose(_run(fast, x, wk, b), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_run(fast, x, wk, ptr(b)), want, rtol=1e-4, atol=1e-4)
    # a strided array that is neither (a channels-last slice of a wider buffer)
    wide = rng.standard_normal((1, 7, 7, 16)).astype(np.float32)
    wide[..., :8] = x.transpose(0, 2, 3, 1)
    strided = from_channels_last(wide)[:, :8]
    assert not strided.flags.c_contiguous
    assert not strided.transpose(0, 2, 3, 1).flags.c_contiguous
    b_str = np.repeat(b, 2)[::2]  # a strided bias: its address is its first element's
    assert not b_str.flags.c_contiguous
    got = _run(fast, x, wk, np.ascontiguousarray(b_str))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_one_primitive_serves_two_weight_arrays_in_turn() -> None:
    """Two nodes of one shape share the cached primitive: each call binds its own weights, so
    alternating calls never read the other node's."""
    rng = np.random.default_rng(22)
    m1: dict = {}
    m2: dict = {}
    x, w1, b1, f1 = _remembered(rng, m1)
    w2 = rng.standard_normal(w1.shape).astype(np.float32)
    b2 = rng.standard_normal(b1.shape).astype(np.float32)
    onednn_conv(x, w2, b2, None, None, ATTRS, channels_last=True, memo=m2)
    assert m2["fast"].entry.prim is f1.entry.prim
    for _ in range(3):
        for w, b, memo in ((w1, b1, m1), (w2, b2, m2)):
            got = onednn_conv(x, w, b, None, None, ATTRS, channels_last=True, memo=memo)
            np.testing.assert_allclose(got, _want(x, w, b), rtol=1e-4, atol=1e-4)


def test_without_the_helper_each_buffer_binds_from_python(monkeypatch) -> None:
    rng = np.random.default_rng(23)
    monkeypatch.setattr(par, "_helper", lambda: None)
    x, w, b, fast = _remembered(rng, {})
    prim = fast.entry.prim
    prim.bound = None  # made again on the next run, now without the helper
    got = onednn_conv(x, w, b, None, None, ATTRS, channels_last=True, memo={"fast": fast})
    assert prim.bound is not None and prim.bound[0] is None
    np.testing.assert_allclose(got, _want(x, w, b), rtol=1e-4, atol=1e-4)
    prim.bound = None  # the next test's runs build the one-call path again


@pytest.mark.parametrize("helper", [True, False])
def test_pinned_buffers_bind_as_arrays_do(monkeypatch, helper: bool) -> None:
    """``pin``'s pointers (a remembered path's weights and bias) give the arrays' answers, in
    the one call and on the Python path."""
    from anychip.backends.cpu.onednn._prim import pin

    rng = np.random.default_rng(24)
    x, w, b, fast = _remembered(rng, {})
    if not helper:
        monkeypatch.setattr(par, "_helper", lambda: None)
        fast.entry.prim.bound = None
    want = _want(x, w, b)
    got = _run(fast, x, pin(fast.wk), pin(b))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert (fast.entry.prim.bound[0] is None) is not helper
    fast.entry.prim.bound = None


@pytest.mark.parametrize("helper", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_a_remembered_convolution_calls_its_primitive_directly(monkeypatch, helper, bias) -> None:
    """``conv._Fast`` binds and executes its primitive in one direct call where the helper
    builds (``_parallel.bound``), else through ``Prim.run``: the same answers, call
    after call, with and without a bias."""
    from anychip.backends.cpu.onednn import conv as conv_mod

    if not helper:
        monkeypatch.setattr(par, "_helper", lambda: None)
    rng = np.random.default_rng(25 + bias)
    w = rng.standard_normal((5, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32) if bias else None
    memo: dict = {}
    for k in range(3):
        x = from_channels_last(rng.standard_normal((1, 6, 7, 8)).astype(np.float32))
        got = onednn_conv(x, w, b, None, None, ATTRS, channels_last=True, memo=memo)
        want = numpy_conv(np.ascontiguousarray(x), w, b, **ATTRS)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        fast = memo["fast"]
        assert isinstance(fast, conv_mod._Fast), k
        assert (fast.direct is not None) is (helper and par._helper() is not None)
    fast.entry.prim.bound = None  # made again by the next test's runs
