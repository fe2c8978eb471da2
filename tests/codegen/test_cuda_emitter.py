"""The CUDA emitter on the shared front half: its source compiles with NVRTC (no GPU needed:
the nvidia-cuda-nvrtc wheel is in the test extra), and the same source, compiled as host C++
with a few lines standing in for CUDA's built-ins, computes what the numpy evaluation of the
expression computes, NaN and infinities included."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from anychip.backends.cpu.kernels.op_fused_elementwise import evaluate
from anychip.backends.cuda import nvrtc
from anychip.codegen import KernelSpec, classify, parse
from anychip.codegen.cuda_emitter import CUDAEmitter

#: every primitive of the front half, and NaN/inf literals
EXPR = (
    "select(ge(in0, 0.0), add(exp(in0), erf(in1)), max(tanh(in2), min(sqrt(abs(in0)),"
    " pow(log(recip(in1)), neg(sigmoid(in0)))))) "
)
EXPR_CONSTS = "add(max(in0, -inf), min(mul(in1, inf), add(in0, nan)))"

SHAPES = [(2, 3, 4, 5), (3, 1, 1), (1,)]  # full, per-channel (R), scalar (S)

_SHIM = r"""
#include <math.h>
#include <string.h>
#define __global__
#define __restrict__ __restrict
struct anychip_dim3 { unsigned x; };
static anychip_dim3 blockIdx, blockDim = {1}, threadIdx = {0};
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
"""


@pytest.mark.parametrize("expr", [EXPR, EXPR_CONSTS])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nvrtc_compiles_the_generated_kernel_without_a_gpu(expr, dtype):
    layout = classify(SHAPES, SHAPES[0])
    assert layout.classes == ("F", "R", "S")
    src = CUDAEmitter().source(KernelSpec(parse(expr), dtype, layout.classes))
    ptx = nvrtc.compile_ptx(src, "fused.cu")
    assert ".entry anychip_fused" in ptx


def _host_kernel(src: str, tmp: Path, n_in: int, ctype: str, n_mods: int):
    """The CUDA source as a host library with a driver looping over the threads."""
    args = ", ".join(
        ["long long outer", "long long inner"]
        + [f"const {ctype} *in{k}" for k in range(n_in)]
        + [f"long long m{k}" for k in range(n_mods)]
        + [f"{ctype} *out"]
    )
    call = ", ".join(
        ["outer", "inner"] + [f"in{k}" for k in range(n_in)] + [f"m{k}" for k in range(n_mods)]
    )
    driver = (
        f'extern "C" void run({args}) {{\n'
        f"  for (long long g = 0; g < outer * inner; ++g) {{ blockIdx.x = (unsigned)g;\n"
        f"    anychip_fused({call}, out); }}\n}}\n"
    )
    (tmp / "k.cpp").write_text(_SHIM + src + driver)
    lib = tmp / "k.so"
    subprocess.run(
        ["g++", "-O1", "-shared", "-fPIC", "-o", str(lib), str(tmp / "k.cpp")],
        check=True,
        capture_output=True,
    )
    return ctypes.CDLL(str(lib)).run


@pytest.mark.parametrize("expr", [EXPR, EXPR_CONSTS])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_kernel_computes_what_numpy_computes(expr, dtype, tmp_path):
    if shutil.which("g++") is None:
        pytest.fail("the host check needs g++ (the XPU simulator's driver needs it too)")
    rng = np.random.default_rng(4)
    dt = np.dtype(dtype)
    xs = [(rng.standard_normal(s) * 2).astype(dt) for s in SHAPES]
    xs[0].flat[:4] = [np.nan, np.inf, -np.inf, 0.0]
    layout = classify([x.shape for x in xs], SHAPES[0])
    spec = KernelSpec(parse(expr), dtype, layout.classes)
    ctype = {"float32": "float", "float64": "double"}[dtype]
    run = _host_kernel(CUDAEmitter().source(spec), tmp_path, 3, ctype, 1)
    out = np.empty(SHAPES[0], dt)
    ptr = ctypes.POINTER(ctypes.c_float if dtype == "float32" else ctypes.c_double)
    mods = [m for m, c in zip(layout.mods, layout.classes) if c == "R"]
    run(
        ctypes.c_longlong(layout.outer),
        ctypes.c_longlong(layout.inner),
        *[x.ctypes.data_as(ptr) for x in xs],
        *[ctypes.c_longlong(m) for m in mods],
        out.ctypes.data_as(ptr),
    )
    want = evaluate(parse(expr), xs, dt)
    tol = 2e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)
    assert np.array_equal(np.isnan(out), np.isnan(want))
