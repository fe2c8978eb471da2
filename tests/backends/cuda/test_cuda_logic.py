"""The CUDA backend's logic without a GPU: probing (every way it can be unavailable), device
names, the device model of a real GPU, CuPy's pool behind anychip's pool interface, pinned
staging, and a session naming ``cuda`` on a machine that has none. The CuPy calls themselves
run only on a GPU (``bench/gpu_check.sh``)."""

from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import pytest

from anychip.backends.cuda.backend import CudaBackend, backends
from anychip.backends.cuda.memory import CupyPool, Staging
from anychip.backends.cuda.probe import GPU_DTYPES, GpuInfo, gpu_model, probe
from anychip.core.memory.pool import MemoryPool
from tests.backends.cuda import fake_cupy


def _raise(exc: BaseException):
    def f():
        raise exc

    return f


def test_probe_without_cupy_says_how_to_install():
    devices, why = probe(_raise(ImportError("No module named 'cupy'")))
    assert devices == [] and "CuPy is not installed" in why and "anychip[cuda]" in why


def test_probe_with_a_broken_cupy_import():
    devices, why = probe(_raise(OSError("libcudart.so.12: cannot open shared object file")))
    assert devices == [] and "CuPy failed to import: OSError: libcudart" in why


def test_probe_without_a_driver():
    err = RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")
    devices, why = probe(lambda: fake_cupy.make(error=err))
    assert devices == [] and "no usable CUDA driver" in why and "cudaErrorInsufficientDriver" in why


def test_probe_without_a_device():
    assert probe(lambda: fake_cupy.make([])) == ([], "the CUDA driver reports no GPU")


def test_probe_two_devices_and_their_names():
    devices, why = probe(lambda: fake_cupy.make([fake_cupy.A100, {**fake_cupy.A100, "minor": 6}]))
    assert why == "" and [d.index for d in devices] == [0, 1]
    assert devices[0].name == "NVIDIA A100-PCIE-40GB" and devices[1].arch == "sm_86"
    names = [b.name for b in backends((tuple(devices), ""))]
    assert names == ["cuda", "cuda:0", "cuda:1"]
    auto = {b.name: b.auto_select for b in backends((tuple(devices), ""))}
    assert auto == {"cuda": True, "cuda:0": False, "cuda:1": False}


def test_unavailable_cuda_refuses_every_node_with_the_reason():
    (b,) = backends(((), "CuPy is not installed (x)"))
    assert b.name == "cuda" and b.available() == (False, "CuPy is not installed (x)")
    assert b.supports(object()) == "cuda is not available here: CuPy is not installed (x)"
    assert b.memory_stats() is None
    assert b.device.dtypes == frozenset({next(iter(b.device.dtypes))})  # a minimal model


def test_gpu_model_of_an_a100():
    devices, _ = probe(lambda: fake_cupy.make([fake_cupy.A100]))
    m = gpu_model("cuda", devices[0])
    assert m.kind == "cuda" and m.memory_capacity == fake_cupy.A100["totalGlobalMem"]
    assert m.mem_bandwidth == pytest.approx(1.555e12, rel=1e-3)  # A100-40GB: 1,555 GB/s
    assert m.flops == pytest.approx(19.5e12, rel=0.01)  # A100: 19.5 TFLOP/s FP32
    assert m.host_link == 2.0e10 and m.launch_overhead == 1.5e-5 and m.dtypes == GPU_DTYPES
    assert not m.problems()


def test_cupy_pool_counts_what_cupy_drops():
    cp = fake_cupy.make()
    raw = cp.cuda.MemoryPool()
    pool = CupyPool("cuda:0", cupy=cp, cupy_pool=raw, capacity=1 << 20)
    assert isinstance(pool, MemoryPool)
    a, b = pool.cupy_malloc(1000), pool.cupy_malloc(3000)
    s = pool.stats()
    assert (s.in_use, s.requested, s.alloc_count, s.free_count) == (1024 + 3072, 4000, 2, 0)
    del a
    gc.collect()
    s = pool.stats()
    assert (s.in_use, s.free_count, s.peak) == (3072, 1, 4096)
    assert s.reserved == 3072 + 1024  # CuPy caches the freed block
    with pool.hold() as held:
        c = pool.cupy_malloc(10)
    assert held == [c]
    del b, c
    gc.collect()
    assert pool.stats().in_use == 512  # held by the capture list
    held.clear()
    gc.collect()
    assert pool.stats().in_use == 0 and pool.trim() == 4096 + 512 and raw.freed_all == 1


def test_cupy_pool_out_of_memory_is_anychips():
    from anychip.errors import OutOfMemoryError

    cp = fake_cupy.make()
    pool = CupyPool("cuda:0", cupy=cp, cupy_pool=cp.cuda.MemoryPool(limit=4096), capacity=None)
    with pytest.raises(OutOfMemoryError):
        pool.cupy_malloc(8192)
    assert pool.stats().in_use == 0


@pytest.mark.parametrize("shape", [(0,), (), (1,), (3, 5, 7), (1 << 19,)])
def test_staging_round_trip_through_pinned_memory(shape):
    cp = fake_cupy.make()
    st = Staging(cp)
    assert st.stream.non_blocking is False  # orders after the legacy default stream's kernels
    host = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    dev = st.upload(host)
    back = st.download(dev)
    assert back.dtype == host.dtype and back.shape == host.shape
    assert np.array_equal(back, host) and not np.shares_memory(back, host)
    if host.size:
        assert dev.set_stream is st.stream and st.stream.syncs == 2
        assert cp.pinned == [max(host.nbytes, 1 << 20)]  # one buffer, reused by the download


def test_cuda_backend_is_an_array_api_backend():
    from anychip.backends.arrayapi import ArrayAPIBackend

    info = GpuInfo(0, "x", 1 << 30, 10, 1_000_000, 1_000_000, 256, (8, 0))
    b = CudaBackend("cuda:0", info)
    assert isinstance(b, ArrayAPIBackend) and b.kept_when_unavailable and not b.auto_select
    assert {k.op_type for k in b.kernel_table()} >= {"Conv", "MatMul", "Softmax", "Gelu"}


@pytest.mark.slow  # a fresh interpreter (it also runs in .ci/run's base-install step)
def test_a_base_install_lists_cuda_with_the_extra_to_install():
    """With the base dependencies only (no CuPy, no array-API packages) the plugin registers
    whole and ``anychip devices`` says what to install: no plugin failure, no traceback."""
    code = (
        "import sys\n"
        "for name in ('cupy', 'array_api_compat', 'array_api_extra'):\n"
        "    sys.modules[name] = None  # not installed: importing it raises ImportError\n"
        "from anychip.cli.main import main\n"
        "sys.exit(main(['devices']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (row,) = [line for line in r.stdout.splitlines() if line.startswith("cuda ")]
    assert "CuPy is not installed" in row and "pip install 'anychip[cuda]'" in row, row
    assert "raised" not in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stderr


def test_array_api_extra_missing_at_run_time_says_what_to_install(monkeypatch):
    from anychip.backends.arrayapi.family._common import extra
    from anychip.errors import KernelError

    monkeypatch.setitem(sys.modules, "array_api_extra", None)
    with pytest.raises(KernelError, match=r"pip install 'anychip\[arrayapi\]'"):
        extra()
