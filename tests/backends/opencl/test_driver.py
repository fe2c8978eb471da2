"""The OpenCL driver layer: device names and availability reasons, copies, the pool, views,
the program cache, and clear errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import anychip
from anychip.backends.opencl.driver import discovery
from anychip.backends.opencl.kernels import op_data, op_matmul
from anychip.core.plan.devices import resolve_devices
from anychip.core.plugin.host import get_registry
from anychip.errors import AnychipError, KernelError


def test_device_names_and_aliases(cl_device):
    names = {d.name: d for d in anychip.devices()}
    assert names["opencl"].available and names["opencl:0"].available
    kind = cl_device.info.type
    assert names[f"opencl:{kind}"].available
    assert names["opencl"].kernels == names["opencl:0"].kernels > 50


def test_cpu_opencl_device_is_used_only_when_named(cl_device):
    auto = resolve_devices(None)
    assert not any(n.startswith("opencl:") for n in auto)  # aliases are never picked
    assert ("opencl" in auto) == (cl_device.info.type != "cpu")
    assert resolve_devices(["opencl:0"], strict=True) == ["opencl:0"]


def test_no_pyopencl_is_a_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyopencl", None)  # import pyopencl raises ImportError
    devices, why = discovery._scan()
    assert devices == [] and "pyopencl is not installed" in why and "anychip[opencl]" in why


def test_no_platform_is_a_reason(monkeypatch):
    class FakeCl:
        @staticmethod
        def get_platforms():
            raise RuntimeError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setitem(sys.modules, "pyopencl", FakeCl)
    devices, why = discovery._scan()
    assert devices == [] and why.startswith("no OpenCL platform") and "PLATFORM_NOT_FOUND" in why


def test_unavailable_backend_says_why(monkeypatch):
    from anychip.backends.opencl import backend as be

    monkeypatch.setattr(be, "find_devices", lambda: ([], "no OpenCL device (test)"))
    (only,) = be.backends()
    assert only.name == "opencl" and only.available() == (False, "no OpenCL device (test)")


@pytest.mark.parametrize(
    "array",
    [
        np.arange(7, dtype=np.float32),
        np.zeros((0, 3), np.float32),
        np.array(3.5, np.float64),
        np.arange(24, dtype=np.int64).reshape(2, 3, 4)[:, ::2],
        np.array([True, False, True]),
        np.arange(1 << 20, dtype=np.uint8),
    ],
    ids=["f32", "empty", "0d", "strided", "bool", "1MiB"],
)
def test_copies_round_trip_and_memory_returns(cl_device, array):
    backend = get_registry().backends["opencl"]
    before = cl_device.pool.stats().in_use
    t = backend.to_device(array)
    back = backend.to_host(t)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    backend.release(t)
    assert cl_device.pool.stats().in_use == before


def test_views_share_storage_until_the_last_release(cl_device):
    x = cl_device.upload(np.arange(12, dtype=np.float32))
    v = op_data.reshape_to(x, [3, 4])
    assert v.buffer is x.buffer
    before = cl_device.pool.stats().in_use
    x.release()
    assert cl_device.pool.stats().in_use == before  # the view still holds the buffer
    np.testing.assert_array_equal(v.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))
    v.release()
    assert cl_device.pool.stats().in_use < before


def test_programs_are_built_once(cl_device):
    a = cl_device.upload(np.ones((9, 5), np.float32))
    b = cl_device.upload(np.ones((5, 3), np.float32))
    for _ in range(3):
        op_matmul.matmul(a, b).release()
    built = [f for f, _, _ in cl_device.programs.builds]
    assert built.count("gemm") <= 1
    a.release()
    b.release()


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    from anychip.backends.opencl.driver.programs import cache_dir

    monkeypatch.setenv("ANYCHIP_OPENCL_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path


def test_bad_shapes_are_kernel_errors(cl_device):
    a = cl_device.upload(np.ones((2, 3), np.float32))
    b = cl_device.upload(np.ones((4, 5), np.float32))
    with pytest.raises(KernelError, match="inner dimensions differ"):
        op_matmul.matmul(a, b)
    with pytest.raises(AnychipError, match="sizes differ"):
        op_data.reshape_to(a, [4, 2])
    a.release()
    b.release()


_BUILD = """
import numpy as np
from anychip.backends.opencl.driver import get_device
from anychip.backends.opencl.kernels.op_normalization import softmax
d = get_device(0)
x = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32)
y = softmax(d.upload(x), -1).numpy()
e = np.exp(x - x.max(-1, keepdims=True))
assert np.allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
print("ok", d.programs.builds[0][0])
"""


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_processes_share_an_empty_cache_dir(tmp_path):
    """Two processes build the same program at once into one empty cache folder (PoCL's and
    pyopencl's): both succeed, and a third one reads what they wrote."""
    import os
    import subprocess

    env = dict(os.environ, ANYCHIP_OPENCL_CACHE_DIR=str(tmp_path))
    env["POCL_CACHE_DIR"] = str(tmp_path / "pocl")
    cmd = [sys.executable, "-c", _BUILD]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        assert out.startswith("ok norm")
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert any((tmp_path / "pyopencl").rglob("*")) and any((tmp_path / "pocl").rglob("*"))
