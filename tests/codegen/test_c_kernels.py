"""Generated C against numpy on random inputs with NaN, +-Inf, denormals and large
magnitudes; the disk cache; the numpy fallback with the compiler hidden."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from anychip.backends.cpu.kernels.op_fused_elementwise import evaluate, fused_elementwise
from anychip.backends.cpu.native.fused import c_kernel
from anychip.codegen import KernelSpec, build, parse

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="needs a C compiler (gcc)")

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 1e-45, 3e38, -3e38, 88.8, -104.5]


def _inputs(rng: np.random.Generator, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-8, 5, shape))
    x = x.astype(dtype)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, size=min(flat.size, 3 * len(SPECIALS)), replace=False)
    flat[idx] = np.resize(np.array(SPECIALS, dtype), idx.size)
    return x


def _close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float = 0.0) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN positions differ"
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol)


EXACT = [
    "add(in0,in1)",
    "sub(mul(in0,in1),div(in0,3.0))",
    "max(in0,in1)",
    "min(neg(in0),abs(in1))",
    "select(ge(in0,0.0),in0,mul(in0,0.01))",
    "min(max(add(mul(in0,0.2),0.5),0.0),1.0)",
    "recip(in1)",
    "sqrt(in0)",
]
ROUNDED = [
    "exp(in0)",
    "tanh(in0)",
    "mul(in0,sigmoid(in0))",
    "log(in0)",
    "pow(in0,0.5)",
    "sigmoid(add(in0,in1))",
]


@pytest.mark.parametrize("text", EXACT + ROUNDED)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_c_matches_numpy(text, dtype):
    rng = np.random.default_rng(zlib.crc32(text.encode()))  # not hash(): salted per process
    x, y = _inputs(rng, (3, 5, 67), dtype), _inputs(rng, (3, 5, 67), dtype)
    got = fused_elementwise(x, y, expr=text)
    want = evaluate(parse(text), [x, y], np.dtype(dtype))
    rtol = 0 if text in EXACT else (1e-6 if dtype == np.float32 else 1e-14)
    _close(got, want, rtol=rtol, atol=0 if text in EXACT else 1e-43)


def test_exp_over_its_whole_range_within_4_ulp_of_numpy():
    x = np.linspace(-110, 95, 400_001, dtype=np.float32)
    got, want = fused_elementwise(x, expr="exp(in0)"), np.exp(x)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
    assert ulps.max() <= 4
    assert np.isinf(got[x > 88.73]).all() and (got[x < -104] == 0).all()


def test_tanh_over_its_whole_range_within_2_ulp_of_numpy():
    """Both branches, the switch at 0.625 and the clamp of the exp path at 9.1 (tanh rounds
    to 1 from about 8.7), infinities, NaN and signed zeros."""
    x = np.concatenate(
        [
            np.linspace(-12, 12, 400_001, dtype=np.float32),
            np.nextafter(np.float32(0.625), np.float32([-1, 1] * 50)).cumsum(dtype=np.float32)[:2],
            np.array([0.625, -0.625, 8.7, 9.1, -9.1, 9.100001, 1e30, -1e30], np.float32),
            np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40], np.float32),
        ]
    )
    got, want = fused_elementwise(x, expr="tanh(in0)"), np.tanh(x)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)

    def ordered(a: np.ndarray) -> np.ndarray:  # float bits in order, -0 and +0 both 0
        i = a.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    assert np.abs(ordered(got[ok]) - ordered(want[ok])).max() <= 2
    big = np.abs(x) >= 9.1  # the clamped exp path: 1 - 2.5e-8, rounded to 1
    assert (got[big] == np.sign(x[big])).all()
    assert np.signbit(got[(x == 0) & np.signbit(x)]).all()


def test_erf_against_float64_reference():
    rng = np.random.default_rng(3)
    x = _inputs(rng, (2000,))
    ref = np.array([math.erf(v) if not np.isnan(v) else np.nan for v in x.astype(np.float64)])
    # Abramowitz & Stegun 7.1.26 (the CPU Erf kernel's formula), 1.5e-7, evaluated in float32
    _close(fused_elementwise(x, expr="erf(in0)"), ref.astype(np.float32), 0, 6e-7)
    want = evaluate(parse("erf(in0)"), [x], np.dtype(np.float32))
    _close(fused_elementwise(x, expr="erf(in0)"), want, 1e-6, 2.5e-7)  # 1 - p * exp(-x^2)


@pytest.mark.parametrize(
    "shapes",
    [
        [(2, 4, 3, 5), (4, 1, 1), ()],  # per-channel and scalar
        [(2, 6, 8), (8,), (6, 1)],  # trailing and row
        [(2, 3, 4), (2, 1, 4), (1,)],  # a broadcast no class fits: expanded first
        [(3, 1), (1, 4), (3, 4)],
    ],
)
def test_broadcast_classes_read_the_right_elements(shapes):
    rng = np.random.default_rng(len(shapes[0]))
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    text = "add(mul(in0,in1),sigmoid(in2))"
    want = xs[0] * xs[1] + 1 / (1 + np.exp(-xs[2]))
    np.testing.assert_allclose(fused_elementwise(*xs, expr=text), want, rtol=1e-6)


def test_built_once_then_read_from_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYCHIP_CODEGEN_CACHE_DIR", str(tmp_path))
    spec = KernelSpec(parse("add(in0,mul(in0,1.25))"), "float32", ("F",))
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr("anychip.backends.cpu.native.fused._cache", {})
    before = len(build.builds)
    assert c_kernel(spec) is not None
    assert len(build.builds) == before + 1 and len(list(tmp_path.glob("*.so"))) == 1
    monkeypatch.setattr(build, "_loaded", {})  # a new process: loads the .so, no build
    monkeypatch.setattr("anychip.backends.cpu.native.fused._cache", {})
    fn = c_kernel(spec)
    assert len(build.builds) == before + 1
    x = np.arange(5, dtype=np.float32)
    out = np.empty_like(x)
    from anychip.codegen import classify

    fn(classify([x.shape], x.shape), [x], out)
    np.testing.assert_array_equal(out, x + x * np.float32(1.25))


@pytest.fixture
def no_compiler(monkeypatch):
    """``$CC`` pointing at a missing program, and the fused kernel's plans made again."""
    from anychip.backends.cpu.kernels.op_fused_elementwise import forget_plans

    monkeypatch.setenv("CC", "/nonexistent/anychip-no-cc")
    forget_plans()
    yield
    monkeypatch.undo()
    forget_plans()


def test_numpy_fallback_with_the_compiler_hidden(no_compiler):
    text = "mul(add(in0,in1),sigmoid(add(in0,in1)))"
    spec = KernelSpec(parse(text), "float32", ("F", "F"))
    assert c_kernel(spec) is None
    assert "no C compiler" in build.status()["failed"]["compiler"]
    rng = np.random.default_rng(7)
    x, y = _inputs(rng, (4, 33)), _inputs(rng, (4, 33))
    got = fused_elementwise(x, y, expr=text)
    with np.errstate(all="ignore"):
        a = x + y
        want = a * (np.float32(1) / (np.float32(1) + np.exp(-a)))
    _close(got, want, rtol=0)


def test_cc_key_follows_the_environment(monkeypatch):
    from anychip.codegen.build import cc_key

    monkeypatch.delenv("CC", raising=False)
    assert cc_key() is None
    monkeypatch.setenv("CC", "/nonexistent/anychip-no-cc")
    hidden = cc_key()
    assert hidden is not None
    monkeypatch.setenv("CC", "gcc")
    assert cc_key() not in (None, hidden)
    monkeypatch.delenv("CC")
    assert cc_key() is None


def test_fused_kernel_writes_in_place_only_over_the_same_first_input():
    """``out`` that is the first input itself is written in place; one overlapping it from
    another first float (or overlapping another input) is not, and the result is a new array."""
    rng = np.random.default_rng(21)
    expr = "mul(in0,mul(0.5,add(erf(div(in0,1.4142135381698608)),1.0)))"
    buf = rng.standard_normal(65).astype(np.float32)
    want = evaluate(parse(expr), [buf[:64].reshape(8, 8)], np.dtype(np.float32))
    x = buf[:64].reshape(8, 8)
    got = fused_elementwise(x.copy(), expr=expr)
    _close(got, want, 1e-6, 2.5e-7)
    same = buf.copy()[:64].reshape(8, 8)
    assert fused_elementwise(same, expr=expr, out=same) is same
    _close(same, want, 1e-6, 2.5e-7)
    shifted_base = buf.copy()
    first, out = shifted_base[:64].reshape(8, 8), shifted_base[1:].reshape(8, 8)
    got = fused_elementwise(first, expr=expr, out=out)
    assert got is not out
    _close(got, want, 1e-6, 2.5e-7)
    np.testing.assert_array_equal(shifted_base, buf)  # nothing written over the input
    a, b = rng.standard_normal((2, 8, 8)).astype(np.float32)
    got = fused_elementwise(a, b, expr="add(in0,in1)", out=b)  # out is the second input
    assert got is not b
