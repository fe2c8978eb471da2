"""The XPU stub's C driver and its launchers, checked against numpy.

Every test gets its own small device (``drv``), so the tests stay independent of the
process-wide driver and can fill the heap on purpose.
"""

from __future__ import annotations

import math
import os
import stat
import threading

import numpy as np
import pytest

from anychip.backends.xpu_stub.driver import XpuDriver, XpuTensor, build_library
from anychip.backends.xpu_stub.driver import launch as K
from anychip.errors import DeviceError, KernelError, OutOfMemoryError, UnsupportedDTypeError

RNG = np.random.default_rng(0)


@pytest.fixture
def drv():
    driver = XpuDriver(heap_bytes=64 << 20, name="xpu-test")
    yield driver
    driver.close()


def rand(*shape: int, dtype=np.float32, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    if np.dtype(dtype).kind == "i":
        return RNG.integers(-50, 50, size=shape).astype(dtype)
    return RNG.uniform(low, high, size=shape).astype(dtype)


def run(drv: XpuDriver, fn, *arrays, **kwargs) -> np.ndarray:
    """Uploads the arrays, runs a launcher, downloads the result and frees everything."""
    tensors = [drv.upload(a) for a in arrays]
    out = fn(*tensors, **kwargs)
    try:
        return out.numpy()
    finally:
        for t in (*tensors, out):
            t.free()
        assert drv.mem_info().used == 0


# ---- element-wise ----------------------------------------------------------------------------

_UNARY_REF = {
    "Relu": lambda x: np.maximum(x, 0),
    "Neg": np.negative,
    "Abs": np.abs,
    "Exp": np.exp,
    "Log": np.log,
    "Sqrt": np.sqrt,
    "Tanh": np.tanh,
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x.astype(np.float64))),
    "Erf": lambda x: np.vectorize(math.erf)(x.astype(np.float64)),
    "Reciprocal": np.reciprocal,
    "Gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
}


@pytest.mark.parametrize("op", sorted(K.UNARY_OPS))
def test_unary_float32_matches_numpy(drv, op):
    positive = op in ("Log", "Sqrt", "Reciprocal")
    x = rand(3, 17, low=0.1 if positive else -6.0, high=6.0)
    got = run(drv, lambda t: K.xpu_unary(op, t), x)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, _UNARY_REF[op](x), rtol=1e-5, atol=1e-6)


def test_gelu_tanh_approximation(drv):
    x = rand(64)
    want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    got = run(drv, lambda t: K.xpu_unary("Gelu", t, approximate="tanh"), x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Relu", "Neg", "Abs"])
def test_unary_int64(drv, op):
    x = rand(5, 7, dtype=np.int64)
    got = run(drv, lambda t: K.xpu_unary(op, t), x)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, _UNARY_REF[op](x))


def test_unary_rejects_int64_for_float_only_ops(drv):
    t = drv.upload(np.arange(3, dtype=np.int64))
    with pytest.raises(UnsupportedDTypeError, match="Exp"):
        K.xpu_unary("Exp", t)
    t.free()
    assert drv.mem_info().used == 0


_BINARY_REF = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Pow": np.power,
    "Max": np.maximum,
    "Min": np.minimum,
}

_SHAPES = [
    ((4, 5), (4, 5)),
    ((2, 3, 4), (4,)),
    ((3, 1, 5), (1, 4, 1)),
    ((), (2, 3)),
    ((6, 1), ()),
    ((2, 1, 3, 1), (5, 1, 7)),
    ((0, 3), (1, 3)),
]


@pytest.mark.parametrize("op", sorted(K.BINARY_OPS))
@pytest.mark.parametrize("shapes", _SHAPES, ids=str)
def test_binary_float32_broadcasting(drv, op, shapes):
    a = rand(*shapes[0], low=0.5 if op == "Pow" else -3.0)
    b = rand(*shapes[1])
    if op == "Div":
        b = np.where(np.abs(b) < 0.1, 1.0, b).astype(np.float32)
    got = run(drv, lambda x, y: K.xpu_binary(op, x, y), a, b)
    want = _BINARY_REF[op](a, b)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_binary_wrappers_and_nan_propagation(drv):
    a = np.array([1.0, np.nan, 3.0], np.float32)
    b = np.array([np.nan, 2.0, 1.0], np.float32)
    np.testing.assert_array_equal(run(drv, K.xpu_max, a, b), np.maximum(a, b))
    np.testing.assert_array_equal(run(drv, K.xpu_min, a, b), np.minimum(a, b))
    np.testing.assert_array_equal(run(drv, K.xpu_sub, a, b), a - b)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Max", "Min"])
def test_binary_int64_broadcasting(drv, op):
    a = rand(3, 1, 4, dtype=np.int64)
    b = rand(5, 1, dtype=np.int64)
    got = run(drv, lambda x, y: K.xpu_binary(op, x, y), a, b)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, _BINARY_REF[op](a, b))


def test_int64_div_truncates_and_pow_stays_integer(drv):
    a = np.array([7, -7, 7, -7, 5, 9], np.int64)
    b = np.array([2, 2, -2, -2, 0, 1], np.int64)
    # C / onnxruntime truncation; division by zero is defined as 0 on the XPU.
    np.testing.assert_array_equal(run(drv, K.xpu_div, a, b), [3, -3, -3, 3, 0, 9])
    base = np.array([2, -3, 5, 1, -1, 2], np.int64)
    exp = np.array([10, 3, 0, -4, -3, -1], np.int64)
    np.testing.assert_array_equal(run(drv, K.xpu_pow, base, exp), [1024, -27, 1, 1, -1, 0])


def test_pow_float_base_int64_exponent(drv):
    base = rand(2, 3, low=0.5, high=2.0)
    exp = np.array([3, -2, 0], np.int64)
    got = run(drv, K.xpu_pow, base, exp)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, base ** exp.astype(np.float32), rtol=1e-6)


def test_binary_shape_mismatch_is_kernel_error(drv):
    a, b = drv.upload(rand(2, 3)), drv.upload(rand(4))
    with pytest.raises(KernelError, match=r"\(2, 3\) and \(4,\)"):
        K.xpu_add(a, b)
    a.free()
    b.free()
    assert drv.mem_info().used == 0


def test_cast_both_ways(drv):
    x = np.array([1.9, -1.9, 0.0, 1e6], np.float32)
    np.testing.assert_array_equal(run(drv, lambda t: K.xpu_cast(t, np.int64), x), [1, -1, 0, 10**6])
    i = np.array([3, -4, 2**40], np.int64)
    np.testing.assert_array_equal(
        run(drv, lambda t: K.xpu_cast(t, np.float32), i), i.astype(np.float32)
    )


# ---- linear algebra --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (1, 5, 4, 6)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((2, 3, 4), (4,)),
        ((4,), (2, 4, 3)),
        ((0, 4), (4, 2)),
        ((3, 0), (0, 2)),
    ],
    ids=str,
)
def test_matmul_matches_numpy(drv, sa, sb):
    a, b = rand(*sa), rand(*sb)
    got = run(drv, K.xpu_matmul, a, b)
    want = np.matmul(a, b)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_matmul_int64_and_mismatch(drv):
    a, b = rand(2, 3, 4, dtype=np.int64), rand(4, 2, dtype=np.int64)
    np.testing.assert_array_equal(run(drv, K.xpu_matmul, a, b), a @ b)
    x, y = drv.upload(rand(3, 4)), drv.upload(rand(5, 2))
    with pytest.raises(KernelError, match="inner dimensions"):
        K.xpu_matmul(x, y)
    x.free()
    y.free()


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (6,), (5, 1), (5, 6), (1, 6)], ids=str)
def test_gemm_matches_numpy(drv, trans_a, trans_b, c_shape):
    m, k, n = 5, 7, 6
    a = rand(k, m) if trans_a else rand(m, k)
    b = rand(n, k) if trans_b else rand(k, n)
    alpha, beta = 0.5, -1.5
    want = alpha * ((a.T if trans_a else a) @ (b.T if trans_b else b))
    arrays = [a, b]
    if c_shape is not None:
        c = rand(*c_shape)
        want = want + beta * c
        arrays.append(c)
    got = run(
        drv,
        lambda *t: K.xpu_gemm(*t, transA=trans_a, transB=trans_b, alpha=alpha, beta=beta),
        *arrays,
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- softmax and reductions ------------------------------------------------------------------


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_and_log_softmax(drv, axis):
    x = rand(3, 4, 5, low=-50, high=50)
    x[0, 0, 0] = 1000.0  # would overflow exp without the max subtraction
    got = run(drv, lambda t: K.xpu_softmax(t, axis), x)
    np.testing.assert_allclose(got, _softmax(x.astype(np.float64), axis), rtol=1e-5, atol=1e-7)
    got_log = run(drv, lambda t: K.xpu_softmax(t, axis, log=True), x)
    want_log = np.log(_softmax(x.astype(np.float64), axis) + 1e-300)
    finite = want_log > -600
    np.testing.assert_allclose(got_log[finite], want_log[finite], rtol=1e-5, atol=1e-4)


def test_softmax_coerce_2d(drv):
    x = rand(2, 3, 4)
    got = run(drv, lambda t: K.xpu_softmax(t, 1, coerce_2d=True), x)
    want = _softmax(x.reshape(2, 12).astype(np.float64), 1).reshape(2, 3, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


_REDUCE_REF = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max, "ReduceMin": np.min}


@pytest.mark.parametrize("op", sorted(K.REDUCE_OPS))
@pytest.mark.parametrize("axes", [None, (0,), (1,), (-1,), (0, 2), (2, 0, 1)], ids=str)
@pytest.mark.parametrize("keepdims", [True, False])
def test_reductions_float32(drv, op, axes, keepdims):
    x = rand(3, 4, 5)
    got = run(drv, lambda t: K.xpu_reduce(op, t, axes, keepdims), x)
    want = _REDUCE_REF[op](x.astype(np.float64), axis=axes, keepdims=keepdims)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin"])
def test_reductions_int64(drv, op):
    x = rand(4, 6, dtype=np.int64)
    got = run(drv, lambda t: K.xpu_reduce(op, t, [1], False), x)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, _REDUCE_REF[op](x, axis=1))


def test_reduce_noop_with_empty_axes_copies(drv):
    x = rand(2, 3)
    got = run(drv, lambda t: K.xpu_reduce("ReduceSum", t, [], noop_with_empty_axes=True), x)
    np.testing.assert_array_equal(got, x)


# ---- data movement ---------------------------------------------------------------------------


@pytest.mark.parametrize("perm", [None, (0, 1, 2), (2, 0, 1), (1, 2, 0), (0, 2, 1)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_transpose(drv, perm, dtype):
    x = (rand(2, 3, 4) > 0).astype(dtype) if dtype == np.bool_ else rand(2, 3, 4).astype(dtype)
    got = run(drv, lambda t: K.xpu_transpose(t, perm), x)
    np.testing.assert_array_equal(got, np.transpose(x, perm))


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_concat(drv, axis, dtype):
    xs = [rand(2, 3, 4, dtype=dtype)]
    for extra in (1, 0, 2):
        shape = [2, 3, 4]
        shape[axis] = extra
        xs.append(rand(*shape, dtype=dtype))
    got = run(drv, lambda *ts: K.xpu_concat(ts, axis), *xs)
    np.testing.assert_array_equal(got, np.concatenate(xs, axis=axis))


_BIG = 2**63 - 1


@pytest.mark.parametrize(
    "starts,ends,axes,steps,index",
    [
        ([1, 0], [2, 3], [0, 1], [1, 2], np.s_[1:2, 0:3:2]),
        ([0, 1], [-1, 1000], None, None, np.s_[0:-1, 1:1000]),
        ([-1], [-_BIG], [1], [-1], np.s_[:, ::-1]),
        ([4, 3], [0, -100], [1, 2], [-2, -1], np.s_[:, 4:0:-2, 3::-1]),
        ([_BIG], [-_BIG], [0], [-3], np.s_[::-3]),
        ([2], [1], [0], [1], np.s_[2:1]),
        ([-100], [100], [-1], [3], np.s_[..., ::3]),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_slice_matches_numpy(drv, starts, ends, axes, steps, index, dtype):
    x = rand(5, 6, 4, dtype=dtype)
    got = run(drv, lambda t: K.xpu_slice(t, starts, ends, axes, steps), x)
    np.testing.assert_array_equal(got, x[index])


def test_expand_and_reshape(drv):
    x = rand(3, 1)
    np.testing.assert_array_equal(
        run(drv, lambda t: K.xpu_expand(t, [2, 1, 4]), x), np.broadcast_to(x, (2, 3, 4))
    )
    y = rand(2, 3, 4, dtype=np.int64)
    got = run(drv, lambda t: K.xpu_reshape(t, [0, -1]), y)
    np.testing.assert_array_equal(got, y.reshape(2, 12))
    t = drv.upload(y)
    view = K.xpu_reshape(t, [4, 6], copy=False)
    assert view.is_view and view.handle == t.handle
    np.testing.assert_array_equal(view.numpy(), y.reshape(4, 6))
    view.free()  # frees nothing: the base owns the buffer
    np.testing.assert_array_equal(t.numpy(), y)
    with pytest.raises(KernelError, match="elements"):
        K.xpu_reshape(t, [5, 5])
    t.free()
    assert drv.mem_info().used == 0


# ---- memory ----------------------------------------------------------------------------------


def test_accounting_alignment_and_peak(drv):
    cap = drv.mem_info().capacity
    assert cap == 64 << 20
    a = drv.malloc(100)
    b = drv.malloc(0)
    assert drv.buffer_size(a) == 100 and drv.buffer_size(b) == 0
    assert drv.mem_info().used == 128 + 64  # 64-byte blocks; an empty tensor still gets one
    drv.free(a)
    info = drv.mem_info()
    assert info.used == 64 and info.peak == 192
    drv.free(b)
    assert drv.mem_info().used == 0


def test_free_list_coalesces_in_any_order(drv):
    handles = [drv.malloc(1000) for _ in range(6)]
    assert drv.heap_stats().blocks == 7
    for h in (handles[1], handles[3]):
        drv.free(h)
    stats = drv.heap_stats()
    assert stats.free_blocks == 3 and stats.blocks == 7  # two holes + the tail, no merges yet
    drv.free(handles[2])  # joins both holes into one
    assert drv.heap_stats().free_blocks == 2
    # First fit: a block that fits the merged hole lands at its start, not in the tail.
    hole = drv.malloc(3 * 1024)
    assert drv.heap_stats().free_blocks == 1
    for h in (handles[0], handles[4], handles[5], hole):
        drv.free(h)
    assert drv.heap_stats() == (1, 1, 64 << 20)


def test_out_of_memory_is_an_error_and_the_heap_stays_usable():
    small = XpuDriver(heap_bytes=4096, name="xpu-small")
    try:
        held = [small.malloc(1024) for _ in range(3)]
        with pytest.raises(OutOfMemoryError) as info:
            small.malloc(2048)
        err = info.value
        assert err.need == 2048 and err.capacity == 4096 and err.in_use == 3072
        assert err.device == "xpu-small" and "1024 of 4096 bytes free" in str(err)
        # Fragmentation: 2 KiB free in total but in two separated 1 KiB holes.
        small.free(held[1])
        with pytest.raises(OutOfMemoryError, match="largest free block 1024"):
            small.malloc(2000)
        last = small.malloc(1024)  # the heap still works after the failures
        small.copy_in(last, np.arange(256, dtype=np.float32))
        np.testing.assert_array_equal(
            small.copy_out(last, (256,), np.float32), np.arange(256, dtype=np.float32)
        )
        with pytest.raises(OutOfMemoryError):
            small.malloc(1 << 40)
    finally:
        small.close()


def test_kernel_output_oom_frees_nothing_it_should_not():
    small = XpuDriver(heap_bytes=4096, name="xpu-small")
    try:
        x = small.upload(np.ones(600, np.float32))  # 2400 bytes: no room for the output
        with pytest.raises(OutOfMemoryError):
            K.xpu_unary("Relu", x)
        assert small.mem_info().used == 2432
        np.testing.assert_array_equal(x.numpy(), np.ones(600, np.float32))
    finally:
        small.close()


def test_bad_handles_are_errors_not_crashes(drv):
    h = drv.malloc(16)
    drv.free(h)
    with pytest.raises(DeviceError, match="already been freed"):
        drv.free(h)
    with pytest.raises(DeviceError, match="invalid device handle"):
        drv.copy_out(h, (4,), np.float32)
    for forged in (0, 12345, 2**64 - 1):
        with pytest.raises(DeviceError, match="invalid device handle"):
            drv.copy_in(forged, np.zeros(4, np.float32))
    g = drv.malloc(16)  # the freed slot is reused with a new generation: the old handle stays dead
    assert g != h
    with pytest.raises(DeviceError, match="invalid device handle"):
        drv.free(h)
    drv.free(g)


def test_out_of_bounds_copies_and_launches_are_rejected(drv):
    h = drv.malloc(16)
    with pytest.raises(DeviceError, match="outside the 16-byte buffer"):
        drv.copy_in(h, np.zeros(5, np.float32))
    with pytest.raises(DeviceError, match="outside"):
        drv.copy_out(h, (2,), np.float32, offset=12)
    with pytest.raises(DeviceError, match="outside"):
        drv.copy_dtod(h, h, 8, dst_offset=12)
    out = drv.malloc(16)
    # A hand-made launch that claims 100 elements in 16-byte buffers: rejected at launch.
    with pytest.raises(DeviceError, match="Relu.*16 bytes"):
        drv.launch("Relu", [h, out], [1, 100])
    with pytest.raises(DeviceError, match="Add expects 3 buffers"):
        drv.launch("Add", [h, out], [1, 1, 4, 1, 1])
    with pytest.raises(DeviceError, match="no kernel 'Conv'"):
        drv.launch("Conv", [h, out])
    # Strided reads that walk outside the source, forward and backward.
    with pytest.raises(DeviceError, match="touches elements"):
        drv.launch("Copy", [h, out], [4, 1, 4, 2, 0, 1, 0])
    with pytest.raises(DeviceError, match="touches elements"):
        drv.launch("Copy", [h, out], [4, 1, 4, -1, 2, 1, 0])
    assert drv.queue_depth() == 0
    drv.free(h)
    drv.free(out)


def test_copies_are_real_poke_changes_device_memory(drv):
    x = np.arange(8, dtype=np.float32)
    t = drv.upload(x)
    x[0] = 100.0  # the device copy does not alias the host array
    assert t.numpy()[0] == 0.0
    drv.poke(t.handle, 4 * 3, np.float32(-7.5).tobytes())
    got = t.numpy()
    assert got[3] == -7.5 and got[2] == 2.0 and got[4] == 4.0
    y = K.xpu_unary("Neg", t)  # kernels read the tampered device bytes
    assert y.numpy()[3] == 7.5
    with pytest.raises(DeviceError, match="outside"):
        drv.poke(t.handle, 30, b"\x00\x00\x00\x00")
    t.free()
    y.free()


def test_launches_queue_until_synchronize_or_a_copy(drv):
    t = drv.upload(np.full(4, -2.0, np.float32))
    out = drv.empty((4,), np.float32)
    drv.launch("Abs", [t.handle, out.handle], [1, 4])
    drv.launch("Neg", [out.handle, out.handle], [1, 4])  # in place, after Abs
    assert drv.queue_depth() == 2
    drv.synchronize()
    assert drv.queue_depth() == 0
    drv.launch("Neg", [out.handle, out.handle], [1, 4])
    np.testing.assert_array_equal(out.numpy(), [2.0] * 4)  # the copy drains the queue first
    drv.launch("Exp", [t.handle, out.handle], [1, 4])
    out.free()  # free drains the queue before the block goes back to the heap
    assert drv.queue_depth() == 0
    t.free()


def test_tensors_from_two_devices_do_not_mix(drv):
    other = XpuDriver(heap_bytes=1 << 20, name="xpu-other")
    try:
        a, b = drv.upload(rand(3)), other.upload(rand(3))
        with pytest.raises(KernelError, match="different XPU devices"):
            K.xpu_add(a, b)
        a.free()
        b.free()
    finally:
        other.close()


def test_closed_driver_refuses_calls():
    d = XpuDriver(heap_bytes=1 << 16)
    h = d.malloc(8)
    d.close()
    d.close()
    with pytest.raises(DeviceError, match="closed"):
        d.free(h)


def test_threads_share_a_driver(drv):
    x = rand(64, 64)
    want = x @ x
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                np.testing.assert_allclose(
                    run_no_check(drv, K.xpu_matmul, x, x), want, rtol=1e-4, atol=1e-3
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert drv.mem_info().used == 0


def run_no_check(drv: XpuDriver, fn, *arrays) -> np.ndarray:
    tensors = [drv.upload(a) for a in arrays]
    out = fn(*tensors)
    try:
        return out.numpy()
    finally:
        for t in (*tensors, out):
            t.free()


def test_xpu_tensor_repr_and_size(drv):
    t = drv.empty((2, 0, 3), np.int64)
    assert t.size == 0 and t.nbytes == 0 and "shape=(2, 0, 3)" in repr(t)
    assert isinstance(t, XpuTensor)
    t.free()


# ---- building ------------------------------------------------------------------------------


def test_missing_compiler_is_a_device_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "anychip-no-such-cc")
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    with pytest.raises(DeviceError, match="anychip-no-such-cc.*install a C compiler"):
        build_library()


def test_no_compiler_on_path_is_a_device_error(monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    with pytest.raises(DeviceError, match="no C compiler found"):
        build_library()


def test_compile_error_reports_command_and_stderr(monkeypatch, tmp_path):
    fake = tmp_path / "broken-cc"
    fake.write_text("#!/bin/sh\necho 'xpu_device.c:1: error: simulated breakage' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(DeviceError, match=r"(?s)status 3.*simulated breakage.*set CC"):
        build_library()
    leftovers = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert leftovers == []  # the failed build left no half-written library behind


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_build_is_cached_and_atomic(monkeypatch, tmp_path):
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    path = build_library()
    assert path.is_file() and path.name == "libxpu.so" and tmp_path in path.parents
    mtime = os.stat(path).st_mtime_ns
    assert build_library() == path and os.stat(path).st_mtime_ns == mtime  # no rebuild
    assert sorted(p.name for p in path.parent.iterdir()) == ["libxpu.so"]
