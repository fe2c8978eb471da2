"""The XPU's blocked float32 MatMul and Gemm (sgemm.c) against numpy: odd and edge sizes,
transposes, broadcast batches, one versus two threads, and each instruction-set path.

Errors are bounded element by element by ``rtol * (|A'| @ |B'|)``, the scale of a float32
dot product's rounding error, so inputs of either sign are checked as tightly as positive ones.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from anychip.backends.xpu_stub.driver import XpuDriver, num_threads, set_num_threads
from anychip.backends.xpu_stub.driver import build as xpu_build
from anychip.backends.xpu_stub.driver import launch as K
from anychip.errors import DeviceError
from tests.backends.xpu_stub.test_driver import run_no_check as run

RTOL = 1e-4


@pytest.fixture(scope="module")
def drv():
    driver = XpuDriver(heap_bytes=96 << 20, name="xpu-matmul-test")
    yield driver
    driver.close()


@pytest.fixture
def threads():
    """Sets the kernels' thread count for one test and restores the default afterwards."""
    yield set_num_threads
    set_num_threads(None)


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def assert_close(got: np.ndarray, a: np.ndarray, b: np.ndarray, want: np.ndarray) -> None:
    """got ~ want where want = a @ b (float64), within RTOL of |a| @ |b| per element."""
    assert got.shape == want.shape and got.dtype == np.float32
    scale = np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= RTOL * scale + 1e-30), f"max error {err.max()} at scale {scale.max()}"


def check_matmul(drv: XpuDriver, sa: tuple, sb: tuple, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a, b = rand(rng, *sa), rand(rng, *sb)
    got = run(drv, K.xpu_matmul, a, b)
    assert_close(got, a, b, np.matmul(a.astype(np.float64), b.astype(np.float64)))
    return got


SIZES = [
    (1, 1, 1),
    (1, 3, 17),
    (3, 17, 1),
    (17, 1000, 3),
    (1000, 3, 17),
    (1, 512, 512),
    (2, 1000, 1000),
    (4, 300, 1000),
    (5, 1024, 33),
    (13, 77, 1000),
    (100, 257, 31),
    (97, 513, 65),
    (255, 255, 257),
    (64, 768, 3072),
    (1024, 1024, 1024),
]


@pytest.mark.parametrize("m,k,n", SIZES, ids=str)
def test_matmul_sizes(drv, m, k, n):
    check_matmul(drv, (m, k), (k, n), seed=m + k + n)


def test_matmul_positive_inputs_rtol(drv):
    """The plain criterion: relative error 1e-4 on random positive inputs up to 1024."""
    rng = np.random.default_rng(7)
    for m, k, n in [(1000, 1024, 17), (1024, 1024, 1024), (3, 1000, 1000)]:
        a, b = rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)
        got = run(drv, K.xpu_matmul, a, b)
        np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((0, 5), (5, 7)),
        ((5, 0), (0, 7)),
        ((5, 7), (7, 0)),
        ((3, 0, 4), (4, 2)),
        ((0, 33, 40), (40, 20)),
        ((2, 40, 0), (0, 50)),
    ],
    ids=str,
)
def test_matmul_zero_sized(drv, sa, sb):
    got = check_matmul(drv, sa, sb)
    if got.size:
        assert not got.any()  # K = 0: a sum of nothing


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((2, 3, 37, 65), (65, 70)),  # B shared, A dense: folds into one tall product
        ((2, 1, 37, 65), (3, 65, 70)),
        ((37, 65), (2, 3, 65, 70)),  # A broadcast
        ((3, 1, 5, 9), (1, 4, 9, 6)),
        ((1, 4, 9, 6), (3, 1, 6, 5)),
        ((7, 64, 64), (7, 64, 64)),  # 7 products on 2 threads: split, then dealt
        ((300, 3, 4), (300, 4, 5)),  # more products than fit one group of the dispatcher
        ((3, 2, 301, 300), (3, 2, 300, 32)),  # narrow (N <= 2 tiles): A' read unpacked
        ((5, 97, 513), (5, 513, 64)),
        ((1000,), (1000, 17)),
        ((17, 1000), (1000,)),
        ((2, 5, 1000), (1000,)),
        ((1000,), (3, 1000, 7)),
    ],
    ids=str,
)
def test_matmul_broadcast_batches(drv, sa, sb):
    check_matmul(drv, sa, sb)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("m,k,n", [(37, 300, 129), (1, 513, 200), (3, 64, 1000), (200, 1, 3)])
@pytest.mark.parametrize("c_shape", ["none", "scalar", "row", "col", "full"])
def test_gemm(drv, trans_a, trans_b, m, k, n, c_shape):
    rng = np.random.default_rng(m * k + n)
    a = rand(rng, k, m) if trans_a else rand(rng, m, k)
    b = rand(rng, n, k) if trans_b else rand(rng, k, n)
    a2, b2 = (a.T if trans_a else a), (b.T if trans_b else b)
    alpha, beta = 0.75, -1.25
    c = {"none": None, "scalar": rand(rng), "row": rand(rng, n), "col": rand(rng, m, 1)}.get(
        c_shape, rand(rng, m, n)
    )
    arrays = [a, b] if c is None else [a, b, c]
    got = run(
        drv,
        lambda *t: K.xpu_gemm(*t, transA=trans_a, transB=trans_b, alpha=alpha, beta=beta),
        *arrays,
    )
    want = alpha * (a2.astype(np.float64) @ b2)
    if c is not None:
        want = want + beta * c.astype(np.float64)
    assert got.shape == (m, n)
    scale = abs(alpha) * (np.abs(a2).astype(np.float64) @ np.abs(b2)) + 1e-6
    assert np.all(np.abs(got - want) <= RTOL * scale)


def test_gemm_k_zero_gives_beta_c(drv):
    c = np.arange(12, dtype=np.float32).reshape(3, 4)
    a, b = np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32)
    got = run(drv, lambda *t: K.xpu_gemm(*t, alpha=2.0, beta=0.5), a, b, c)
    np.testing.assert_array_equal(got, 0.5 * c)


@pytest.mark.parametrize(
    "sa,sb",
    [
        # all above the 2**21 multiply-adds below which one thread computes
        ((1, 4096), (4096, 600)),  # few rows: unpacked path, split along N
        ((3, 1000), (1000, 1000)),
        ((26, 4000), (4000, 21)),  # split along M: the 2-row remainder joins its neighbour
        ((40, 6000), (6000, 9)),
        ((64, 768), (768, 3072)),
        ((300, 301), (301, 299)),
        ((5, 300, 40), (40, 50)),
        ((3, 130, 140), (3, 140, 150)),
        ((50, 3000), (3000, 100)),  # packed A on one thread, read in place in the N pieces
        ((16, 512, 512), (16, 512, 32)),  # attention's probabilities @ V
    ],
    ids=str,
)
def test_one_and_two_threads_agree_bit_for_bit(drv, threads, sa, sb):
    threads(1)
    assert num_threads() == 1
    one = check_matmul(drv, sa, sb, seed=3)
    threads(2)
    assert num_threads() == 2
    two = check_matmul(drv, sa, sb, seed=3)
    np.testing.assert_array_equal(one, two)


def test_gemm_transposed_one_and_two_threads_agree(drv, threads):
    rng = np.random.default_rng(5)
    a, b = rand(rng, 500, 300), rand(rng, 400, 500)

    def gemm(*t):
        return K.xpu_gemm(*t, transA=1, transB=1, alpha=1.5)

    threads(1)
    one = run(drv, gemm, a, b)
    threads(2)
    np.testing.assert_array_equal(run(drv, gemm, a, b), one)


def test_thread_count_setting(threads):
    with pytest.raises(DeviceError, match="outside"):
        threads(-1)
    with pytest.raises(DeviceError, match="outside"):
        threads(65)
    threads(3)
    assert num_threads() == 3
    threads(None)
    env = os.environ.get("ANYCHIP_XPU_THREADS", "")
    if not env:
        assert num_threads() == min(2, os.cpu_count() or 1)


# ---- building: flags and CPU in the cache key, every instruction-set path ---------------------


def test_cache_key_includes_march_and_cpu(monkeypatch):
    compiler, sources = ["cc"], sorted(Path(xpu_build.__file__).parent.glob("*.c"))
    monkeypatch.delenv("ANYCHIP_XPU_MARCH", raising=False)
    native = xpu_build._build_key(compiler, sources)
    assert "-march=native" in xpu_build._cflags() and "-O3" in xpu_build._cflags()
    monkeypatch.setenv("ANYCHIP_XPU_MARCH", "x86-64")
    assert xpu_build._build_key(compiler, sources) != native
    monkeypatch.delenv("ANYCHIP_XPU_MARCH")
    monkeypatch.setattr(xpu_build, "_cpu_identity", lambda: "flags: sse2 (another CPU)")
    assert xpu_build._build_key(compiler, sources) != native


_PATH_CHECK = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from anychip.backends.xpu_stub.driver import XpuDriver, set_num_threads
    from anychip.backends.xpu_stub.driver import launch as K
    drv = XpuDriver(heap_bytes=32 << 20)
    rng = np.random.default_rng(1)
    worst = 0.0
    cases = [((1, 70), (70, 33)), ((4, 9), (9, 100)), ((7, 33), (33, 17)),
             ((130, 300), (300, 70)), ((2, 3, 13, 20), (20, 19))]
    for threads in (1, 2):
        set_num_threads(threads)
        for sa, sb in cases:
            a = rng.uniform(-1, 1, sa).astype(np.float32)
            b = rng.uniform(-1, 1, sb).astype(np.float32)
            ta, tb = drv.upload(a), drv.upload(b)
            for y, want, scale in [
                (K.xpu_matmul(ta, tb), a.astype(np.float64) @ b, np.abs(a) @ np.abs(b)),
            ] + ([(K.xpu_gemm(tb, ta, transA=1, transB=1), (a.astype(np.float64) @ b).T,
                   (np.abs(a) @ np.abs(b)).T)] if len(sa) == 2 else []):
                worst = max(worst, float((np.abs(y.numpy() - want) / (scale + 1e-30)).max()))
                y.free()
            ta.free(); tb.free()
    print(json.dumps(worst))
    """
)


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.parametrize("march", ["haswell", "x86-64"])
def test_other_instruction_set_paths(tmp_path, march):
    """-march=haswell builds the AVX2+FMA 6x16 kernel, -march=x86-64 the scalar one (this
    machine's native build takes the widest path its CPU has)."""
    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("gcc") is None:
        pytest.skip("needs gcc on x86-64")
    if march == "haswell" and "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU cannot run AVX2 code")
    env = {**os.environ, "ANYCHIP_XPU_MARCH": march, "ANYCHIP_CACHE_DIR": str(tmp_path)}
    env.pop("CC", None)
    out = subprocess.run(
        [sys.executable, "-c", _PATH_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) <= RTOL
    built = list(tmp_path.rglob("libxpu.so"))
    assert len(built) == 1  # built for this march in the test's own cache


def test_few_rows_by_a_transposed_weight_one_and_two_threads(drv, threads):
    """M <= 4 times a B stored transposed (a fully connected layer at batch 1-4): dot products
    of contiguous rows (K not a multiple of the 16 lanes), split along N over the threads."""
    rng = np.random.default_rng(6)
    a, b = rand(rng, 3, 9999), rand(rng, 777, 9999)

    def gemm(*t):
        return K.xpu_gemm(*t, transB=1)

    threads(1)
    one = run(drv, gemm, a, b)
    assert_close(one, a, b.T, a.astype(np.float64) @ b.T.astype(np.float64))
    threads(2)
    np.testing.assert_array_equal(run(drv, gemm, a, b), one)
