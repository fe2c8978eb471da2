"""The OpenCL emitter shares the front half: its source for a spec, and that source run on
PoCL (pyopencl and its CPU driver are in the test extra) against numpy."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels.op_fused_elementwise import evaluate
from anychip.codegen import KernelSpec, classify, parse
from anychip.codegen.opencl_emitter import OpenCLEmitter

TEXT = "mul(add(in0,in1),sigmoid(add(in0,in1)))"


def test_source_reads_each_broadcast_class():
    src = OpenCLEmitter().source(KernelSpec(parse(TEXT), "float32", ("F", "R")))
    assert "__kernel void anychip_fused(" in src
    assert "const float r1 = in1[o % m1];" in src and "in0[base + i]" in src
    assert "exp(-t2)" in src and "expf" not in src and "ac_expf" not in src
    assert src.count("t2 =") == 1  # the shared Add computed once
    src64 = OpenCLEmitter().source(KernelSpec(parse("erf(in0)"), "float64", ("S",)))
    assert "cl_khr_fp64" in src64 and "erf(t0)" in src64


def test_runs_on_pocl():
    from anychip.backends.opencl.driver.discovery import find_devices

    devices, why = find_devices()  # pyopencl[pocl] is in the test extra: this runs in CI
    assert devices, why
    import pyopencl as cl

    ctx = cl.Context([devices[0].device])
    queue = cl.CommandQueue(ctx)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 40)).astype(np.float32)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    b = rng.standard_normal((6, 1)).astype(np.float32)
    layout = classify([x.shape, b.shape], x.shape)
    spec = KernelSpec(parse(TEXT), "float32", layout.classes)
    prg = cl.Program(ctx, OpenCLEmitter().source(spec)).build()
    mf = cl.mem_flags
    bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a) for a in (x, b)]
    out = cl.Buffer(ctx, mf.WRITE_ONLY, x.nbytes)
    k = prg.anychip_fused
    n = np.int64
    k(queue, (x.size,), None, n(layout.outer), n(layout.inner), *bufs, n(layout.mods[1]), out)
    got = np.empty_like(x)
    cl.enqueue_copy(queue, got, out)
    want = evaluate(parse(TEXT), [x, b], np.dtype(np.float32))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)
