"""Generated C on several threads (``backends/cpu/native/pool.py``): threaded results equal the
one-thread
results bit for bit (element-wise chains of every broadcast class, softmax and layer-norm rows,
NaN and +-Inf included, in place) and numpy's within the C's own tolerance; without the pool
the chunks run on the caller; callers from many Python threads at once; a fused transformer
layer with every threshold at zero equals onnxruntime."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import anychip.backends.cpu.native.fused as cg
from anychip.backends.cpu.kernels import op_fused_attention
from anychip.backends.cpu.kernels.op_fused_elementwise import (
    evaluate,
    fused_elementwise,
)
from anychip.backends.cpu.native import attention, omp, pool, rows
from anychip.codegen import build, parse

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="needs a C compiler (gcc)")

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e38, -3e38, 88.8, -104.5]


def _rand(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, size=min(flat.size, 2 * len(SPECIALS)), replace=False)
    flat[idx] = np.resize(np.array(SPECIALS, np.float32), idx.size)
    return x


@pytest.fixture
def team(monkeypatch):
    """Two OpenMP threads, every call on the team (the thresholds at zero); counts how often
    a kernel asked for the team. Yields a function that runs a callable on one thread."""
    if not omp.available():
        pytest.skip("libgomp is not loadable")
    asked = []
    real = omp.max_threads

    def counted() -> int:
        asked.append(1)
        return real()

    kept = real()
    omp.set_threads(2)
    monkeypatch.setattr(cg, "PARALLEL_WORK", 0)
    monkeypatch.setattr(omp, "max_threads", counted)

    def serial(fn, *args, **kw):
        with monkeypatch.context() as mp:
            mp.setattr(cg, "PARALLEL_WORK", 1 << 62)
            return fn(*args, **kw)

    serial.asked = asked
    yield serial
    omp.set_threads(kept)


EXPRS = [
    "mul(in0,sigmoid(add(in0,in1)))",
    "add(mul(tanh(in0),in1),erf(div(in0,1.4142135)))",
    "select(gt(in0,in1),exp(in0),pow(abs(in1),0.5))",
]
SHAPES = [  # the second input: full, per-row (R), per-inner (I), scalar
    ((3, 7, 1001), (3, 7, 1001)),
    ((5, 37, 53), (5, 1, 1)),
    ((2, 129, 33), (33,)),
    ((4099,), (1,)),
]


@pytest.mark.parametrize("expr", EXPRS)
@pytest.mark.parametrize("shapes", SHAPES)
def test_threaded_elementwise_equals_one_thread(team, expr, shapes):
    rng = np.random.default_rng(len(expr) + shapes[0][-1])
    a, b = _rand(rng, shapes[0]), _rand(rng, shapes[1])
    one = team(fused_elementwise, a, b, expr=expr)
    before = len(team.asked)
    got = fused_elementwise(a, b, expr=expr)
    assert len(team.asked) > before, "the threaded path did not run"
    np.testing.assert_array_equal(got, one)  # NaN in the same places, every bit else
    want = evaluate(parse(expr), [a, b], np.dtype(np.float32))
    ok = np.isfinite(want)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~ok & ~np.isnan(want)], want[~ok & ~np.isnan(want)])
    np.testing.assert_allclose(got[ok], want[ok], rtol=5e-6, atol=2e-7)


def test_threaded_in_place(team):
    rng = np.random.default_rng(3)
    x = _rand(rng, (6, 1000))
    want = team(fused_elementwise, x, expr="mul(in0,sigmoid(in0))")
    y = x.copy()
    got = fused_elementwise(y, expr="mul(in0,sigmoid(in0))", out=y)
    assert got is y
    np.testing.assert_array_equal(got, want)


def test_a_threaded_call_counts_once_as_wanted(team):
    """``pool.wanted()`` counts each call that asked for threads once, whether it ran on the
    pool or, backing off, on its caller."""
    rng = np.random.default_rng(11)
    a, b = _rand(rng, (3, 7, 1001)), _rand(rng, (3, 7, 1001))
    fused_elementwise(a, b, expr=EXPRS[0])  # built and warm
    for _ in range(3):
        before = pool.wanted()
        fused_elementwise(a, b, expr=EXPRS[0])
        assert pool.wanted() == before + 1


@pytest.mark.parametrize("shape", [(3, 1000), (2, 3, 17, 129)])
def test_threaded_softmax_rows_equal_one_thread(team, shape):
    rng = np.random.default_rng(shape[-1])
    x = _rand(rng, shape)
    mask = _rand(rng, shape[-2:])
    one, got = np.empty_like(x), np.empty_like(x)
    assert team(rows.softmax_rows, x, one, mask, 8.0, 1)
    before = len(team.asked)
    assert rows.softmax_rows(x, got, mask, 8.0, 1)
    assert len(team.asked) > before
    np.testing.assert_array_equal(got, one)


def test_threaded_layer_norm_rows_equal_one_thread(team):
    rng = np.random.default_rng(11)
    x = _rand(rng, (3, 41, 96))
    scale, bias = _rand(rng, (96,)), _rand(rng, (96,))
    one = team(rows.layer_norm_rows, x, scale, bias, 1e-5, -1)
    got = rows.layer_norm_rows(x, scale, bias, 1e-5, -1)
    for g, o in zip(got, one):
        np.testing.assert_array_equal(g, o)


def test_without_the_pool_the_chunks_run_on_the_caller(team, monkeypatch):
    rng = np.random.default_rng(5)
    x, b = _rand(rng, (4, 3000)), _rand(rng, (3000,))
    expr = "add(mul(in0,in1),exp(in1))"
    want = team(fused_elementwise, x, b, expr=expr)
    monkeypatch.setattr(pool, "address", lambda: 0)  # the pool could not be built
    np.testing.assert_array_equal(fused_elementwise(x, b, expr=expr), want)
    one, got = np.empty_like(x), np.empty_like(x)
    assert team(rows.softmax_rows, x, one) and rows.softmax_rows(x, got)
    np.testing.assert_array_equal(got, one)


def test_pool_called_from_many_threads_at_once(team):
    """One job at a time: callers that find the pool busy run their chunks themselves."""
    rng = np.random.default_rng(9)
    xs = [_rand(rng, (8, 4096)) for _ in range(6)]
    expr = "mul(in0,sigmoid(in0))"
    want = [team(fused_elementwise, x, expr=expr) for x in xs]

    def work(k: int) -> bool:
        return all(
            np.array_equal(fused_elementwise(xs[k], expr=expr), want[k], equal_nan=True)
            for _ in range(30)
        )

    with ThreadPoolExecutor(6) as ex:
        assert all(ex.map(work, range(6)))


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_layer_on_the_team_equals_onnxruntime(team, monkeypatch, causal):
    from anychip.backends.cpu.onednn import _lib
    from tests.backends.cpu._fusion_models import check
    from tests.models import transformer_layer

    monkeypatch.setattr(_lib, "SMALL_WORK", 0)  # oneDNN's primitives on the team too
    monkeypatch.setattr(op_fused_attention, "HEADS_SPLIT_WORK", 0)
    monkeypatch.setattr(pool, "try_parallel", lambda: True)
    before = len(team.asked)
    counts = check(transformer_layer(seq=16, hidden=64, heads=2, ffn=128, causal=causal))
    assert counts["fuse_attention"] == 1 and counts["fuse_gelu"] == 1
    assert len(team.asked) > before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_works_in_a_forked_child(team):
    """The child has none of the parent's pool threads: it makes its own."""
    rng = np.random.default_rng(13)
    x = _rand(rng, (8, 5000))
    expr = "mul(in0,sigmoid(in0))"
    want = team(fused_elementwise, x, expr=expr)
    fused_elementwise(x, expr=expr)  # the parent's threads exist
    pid = os.fork()
    if pid == 0:  # the child: exit 0 when the threaded result is right
        ok = np.array_equal(fused_elementwise(x, expr=expr), want, equal_nan=True)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.fixture
def blas_one():
    """numpy's OpenBLAS at one thread, as inside a CPU partition."""
    from anychip.core.run.blas import openblas_threads

    fns = openblas_threads()
    if fns is None or attention.sgemm_address() == 0:
        pytest.skip("needs numpy's ILP64 OpenBLAS")
    kept = fns[0]()
    fns[1](1)
    yield
    fns[1](kept)


MASKS = [None, (1, 1, 33, 40), (2, 1, 1, 40), (40,), (2, 3, 33, 40)]


@pytest.mark.parametrize("mask_shape", MASKS)
@pytest.mark.parametrize("divide", [1, 0])
def test_heads_on_the_pool_equal_the_numpy_path(team, blas_one, monkeypatch, mask_shape, divide):
    rng = np.random.default_rng(len(mask_shape or ()) + divide)
    q, kt, v = _rand(rng, (2, 3, 33, 16)), _rand(rng, (2, 3, 16, 40)), _rand(rng, (2, 3, 40, 24))
    mask = None if mask_shape is None else _rand(rng, mask_shape)
    monkeypatch.setattr(op_fused_attention, "HEADS_SPLIT_WORK", 1 << 62)
    want = op_fused_attention.fused_attention(q, kt, v, mask, scale=4.0, divide=divide)
    for threads in (1, 2):
        got = attention.attention(q, kt, v, mask, 4.0, 1 if divide else 2, threads)
        np.testing.assert_array_equal(got, want)  # the same sgemm and rows, NaN included
    monkeypatch.setattr(op_fused_attention, "HEADS_SPLIT_WORK", 0)
    monkeypatch.setattr(pool, "try_parallel", lambda: True)
    before = len(team.asked)
    got = op_fused_attention.fused_attention(q, kt, v, mask, scale=4.0, divide=divide)
    assert len(team.asked) > before
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mask_shape", [None, (1, 1, 33, 40)])
def test_heads_read_transposed_views_of_q_and_v(team, blas_one, monkeypatch, mask_shape):
    """Q and V as the exports make them, [B, S, H, D] projections transposed as views (row
    stride H * D): read through sgemm's lda/ldb, equal to numpy's path on the same views."""
    rng = np.random.default_rng(9)
    qp, vp = _rand(rng, (2, 33, 3, 16)), _rand(rng, (2, 40, 3, 24))
    q, v = qp.transpose(0, 2, 1, 3), vp.transpose(0, 2, 1, 3)
    kt = _rand(rng, (2, 3, 16, 40))
    mask = None if mask_shape is None else _rand(rng, mask_shape)
    monkeypatch.setattr(op_fused_attention, "HEADS_SPLIT_WORK", 1 << 62)
    want = op_fused_attention.fused_attention(q, kt, v, mask, scale=4.0, divide=1)
    for threads in (1, 2):
        got = attention.attention(q, kt, v, mask, 4.0, 1, threads)
        assert got is not None
        np.testing.assert_array_equal(got, want)  # the same sgemm and rows, NaN included
    three = attention.attention(q[0], kt[0], v[0], None, 4.0, 1, 2)  # rank 3, strided
    np.testing.assert_array_equal(
        three, op_fused_attention.fused_attention(q[0], kt[0], v[0], scale=4.0, divide=1)
    )
    assert attention.attention(q[..., ::2], kt[:, :, ::2], v, None, 4.0, 1, 2) is None


def test_heads_path_declines_what_it_cannot_run(blas_one):
    rng = np.random.default_rng(2)
    q, kt, v = _rand(rng, (3, 8, 4)), _rand(rng, (3, 4, 9)), _rand(rng, (3, 9, 5))
    assert attention.attention(q, kt, v, None, 2.0, 1, 2) is not None
    assert attention.attention(q, kt[:1], v, None, 2.0, 1, 2) is None  # broadcast batch
    assert attention.attention(q.astype(np.float64), kt, v, None, 2.0, 1, 2) is None
    assert attention.attention(q, kt.transpose(0, 2, 1).copy().transpose(0, 2, 1), v, None,
                               2.0, 1, 2) is None  # fmt: skip
    from anychip.core.run.blas import openblas_threads

    get, put = openblas_threads()
    put(2)  # OpenBLAS threaded: numpy's own path
    try:
        assert attention.attention(q, kt, v, None, 2.0, 1, 2) is None
    finally:
        put(1)


@pytest.mark.parametrize("mask_shape", [None, (1, 1, 33, 33)])
def test_heads_attention_on_the_pool_equals_its_one_thread_path(
    team, blas_one, monkeypatch, mask_shape
):
    """``HeadsAttention`` over the strided parts of one packed projection: the pool's heads
    equal the one-thread path bit for bit, written into the merged heads' layout."""
    from anychip.backends.cpu.kernels.op_heads_attention import heads_attention

    rng = np.random.default_rng(21)
    packed = _rand(rng, (2, 33, 3 * 3 * 16))
    q, k, v = packed[..., :48], packed[..., 48:96], packed[..., 96:]
    mask = None if mask_shape is None else _rand(rng, mask_shape)
    s4, s3 = np.array([2, 33, 3, 16], np.int64), np.array([2, 33, 48], np.int64)
    args = (q, k, v, s4, s4, s4, s3, mask)
    monkeypatch.setattr(op_fused_attention, "HEADS_SPLIT_WORK", 1 << 62)
    want = heads_attention(*args, scale=4.0, divide=1)
    monkeypatch.setattr(op_fused_attention, "HEADS_SPLIT_WORK", 0)
    monkeypatch.setattr(pool, "try_parallel", lambda: True)
    before = len(team.asked)
    out = np.empty((2, 33, 48), np.float32)
    got = heads_attention(*args, scale=4.0, divide=1, out=out)
    assert len(team.asked) > before and got is out
    np.testing.assert_array_equal(got, want)


def test_a_backoff_lasts_a_time_not_a_count_of_calls():
    """While backing off every call runs alone, however many come; after the backoff's time
    the pool is offered again (an LSTM's one pool call a run no longer stays alone for
    sixteen runs)."""
    import time

    if pool.address() == 0:
        pytest.skip("needs a C compiler for the pool")
    try:
        for _ in range(3):  # a process preempted past the backoff's time tries again
            before = pool.stats()["backoff_jobs"]
            t0 = time.perf_counter()
            pool.back_off()
            offered = [pool.try_parallel() for _ in range(40)]  # more than the old 32 calls
            if time.perf_counter() - t0 < pool.BACKOFF_SECONDS * 0.9:
                break
        assert not any(offered)
        assert pool.stats()["backoff_jobs"] - before == 40
        time.sleep(pool.BACKOFF_SECONDS * 2)
        assert pool.try_parallel()
    finally:
        pool.reset_backoff()


def _until(cond, seconds: float = 2.0) -> bool:
    import time

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if cond():
            return True
        time.sleep(0.001)
    return cond()


@pytest.mark.parametrize("prewake", [1, 0])
def test_a_hold_wakes_sleeping_threads_before_the_first_job(prewake):
    """A run entering ``held()`` wakes the pool's sleeping threads without a job (they spin
    for its first one); with the wake switched off they sleep on until a job comes (in one
    of the tries within 10 s: a loaded suite once saw a sleeper wake with no job and no wake
    asked, and on this VM the second core was taken for seconds, the thread running no part)."""
    if pool.address() == 0:
        pytest.skip("needs a C compiler for the pool")
    from anychip.backends.cpu.native.gemv import gemv

    lib = pool._lib()
    rng = np.random.default_rng(5)
    # parts long enough (about a ms each) that the pool's thread wakes and runs one
    x, w = rng.standard_normal((1, 2048), np.float32), rng.standard_normal((2048, 2048), np.float32)
    kept = omp.max_threads()
    omp.set_threads(2)
    asked = -1
    try:
        import time

        end = time.perf_counter() + 10  # another tenant may hold the second core a while
        while time.perf_counter() < end:  # until the thread took a part, no other job came
            pool.reset_backoff()
            ran = pool.stats()["pool_chunks"]
            gemv(x, w, None, True, 2)
            if pool.stats()["pool_chunks"] == ran:
                continue  # it woke too late for either part: no settled sleep to test
            assert _until(lambda: pool.sleepers() >= 1)  # its spin (50 us) ran out
            lib.ac_pool_prewake(prewake)
            asked = pool.wanted()
            with pool.held():
                woke = _until(lambda: pool.sleepers() == 0, 0.5)
            lib.ac_pool_prewake(1)
            if pool.wanted() == asked and woke is bool(prewake):
                break  # else another try: under a loaded suite a sleeper woke on its own once
        assert pool.wanted() == asked, "the thread ran no part, or other jobs came, every try"
        assert woke is bool(prewake)
    finally:
        lib.ac_pool_prewake(1)
        omp.set_threads(kept)
        pool.reset_backoff()


_SLEEPING_WAIT = """
import threading, time
import numpy as np
from cffi import FFI
from anychip.backends.cpu.native import omp, pool
from anychip.backends.cpu.native.gemv import gemv

if pool.address() == 0:
    print("SKIP needs a C compiler for the pool")
    raise SystemExit(0)
ffi = FFI()
run = ffi.cast("void (*)(void (*)(void *, long), void *, long, int)", pool.address())
caller, started = threading.get_ident(), threading.Event()

@ffi.callback("void (void *, long)")
def chunk(ctx, i):
    if threading.get_ident() == caller:
        started.wait(10.0)  # the pool's thread has the other chunk (or, late, none)
    else:
        started.set()
        time.sleep(0.05)

rng = np.random.default_rng(6)
x, w = rng.standard_normal((1, 2048), np.float32), rng.standard_normal((2048, 2048), np.float32)
want = gemv(x, w, None, True, 1)
omp.set_threads(2)
before = pool.stats()["slept_jobs"]
pool.block_after(1)  # any wait past the first spins sleeps
for _ in range(10):  # a pool thread that never woke within 10 s: the caller ran both
    started.clear()
    pool.reset_backoff()
    run(chunk, ffi.NULL, 2, 2)
    if pool.stats()["slept_jobs"] > before:
        break
assert pool.stats()["slept_jobs"] > before, pool.stats()
pool.reset_backoff()
assert np.array_equal(gemv(x, w, None, True, 2), want)
print("DONE")
"""


def test_a_caller_waiting_long_for_a_chunk_sleeps_and_is_woken():
    """A caller whose remaining chunk runs on a pool thread past ``block_after`` waits asleep
    (its core free for that thread, were it preempted) and is woken when the chunk ends; a
    kernel's results with sleeping waits equal one thread's.

    The pool's thread is made to end last by the chunks themselves: the caller's chunk returns
    only once a pool thread has started the other, which then takes 50 ms. (Waiting for that
    order to happen by chance failed in CI beside another test process.) In a fresh
    interpreter: in the whole suite's worker the pool had never slept after ten tries (CI,
    twice; alone and in this file it passes), so other tests' pool state (a job of a thread
    left running, a pause) can keep it from running side by side."""
    import subprocess
    import sys
    from pathlib import Path

    import anychip

    here = str(Path(anychip.__file__).parent.parent)  # this anychip first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-c", _SLEEPING_WAIT], capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    if proc.stdout.startswith("SKIP"):
        pytest.skip(proc.stdout.strip())
    assert "DONE" in proc.stdout, tail
