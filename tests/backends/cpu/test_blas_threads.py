"""numpy's OpenBLAS runs at one thread inside a CPU partition when oneDNN is there, and the
caller's count is back after the run; small oneDNN primitives run on one OpenMP thread."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.onednn import _lib
from anychip.core.run.blas import openblas_threads, single_blas_thread


def test_openblas_at_one_thread_inside_and_restored_after() -> None:
    found = openblas_threads()
    assert found is not None, "numpy's wheels ship OpenBLAS; its thread calls were not found"
    get, put = found
    before = get()
    try:
        put(2)
        seen: list[int] = []
        run = single_blas_thread(lambda tensors: seen.append(get()) or tensors)
        assert run([1]) == [1]
        assert seen == [1] and get() == 2
    finally:
        put(before)


def test_cpu_partitions_are_wrapped_with_onednn() -> None:
    assert _lib.findable(), _lib.unavailable_reason()
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 64])],
        [numpy_helper.from_array(w, "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m)
    sess = anychip.load(m, devices="cpu")
    assert hasattr(sess.partitions[0].program, "wrapped")
    x = rng.standard_normal((256, 64)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-4)


def test_small_onednn_work_runs_on_one_openmp_thread() -> None:
    from threadpoolctl import threadpool_limits

    assert _lib.available(), _lib.unavailable_reason()
    with threadpool_limits(limits=2, user_api="openmp"):
        assert _lib.omp_threads() == 2
        with _lib.team_for(_lib.SMALL_WORK - 1):
            assert _lib.omp_threads() == 1
        assert _lib.omp_threads() == 2
        with _lib.team_for(_lib.SMALL_WORK):
            assert _lib.omp_threads() == 2
