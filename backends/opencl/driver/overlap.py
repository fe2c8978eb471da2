"""Whether an OpenCL device runs a host-to-device copy while a kernel runs (``copy_overlap``).

OpenCL has no device query for it: a GPU with a copy engine overlaps (from pinned host memory),
a CPU driver may or may not run two queues at once. The probe measures it with the device's own
clock: on two profiling queues of the device's context, a kernel that runs for some
milliseconds, then a copy of ``nbytes`` enqueued right after it on the other queue; the device
overlaps when the copy's [start, end] interval intersects the kernel's.

Measured on PoCL 3.0 (CPU): with two worker threads the copy runs beside the kernel; with one
(``POCL_MAX_PTHREAD_COUNT=1``) its one thread runs the commands one after another.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["copy_overlap"]

_BUSY = r"""
__kernel void busy(__global float* x, int iters) {
    int i = get_global_id(0);
    float v = x[i];
    for (int k = 0; k < iters; ++k) v = v * 0.999999f + 0.000001f;
    x[i] = v;
}
"""


def copy_overlap(device: Any, nbytes: int = 8 << 20, iters: int = 5000) -> dict[str, Any]:
    """Measure on ``device`` (a ``ClDevice``): ``{"overlap": bool, "kernel_ms", "copy_ms",
    "shared_ms"}``, where ``shared_ms`` is the time both ran at once (device clock)."""
    import pyopencl as cl

    ctx, dev = device.context, device.info.device
    props = cl.command_queue_properties.PROFILING_ENABLE
    q_run, q_copy = cl.CommandQueue(ctx, dev, props), cl.CommandQueue(ctx, dev, props)
    prg = cl.Program(ctx, _BUSY).build()
    n = 4096
    work = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n * 4)
    cl.enqueue_copy(q_run, work, np.ones(n, np.float32))
    target = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes)
    host = np.ones(nbytes // 4, np.float32)
    cl.enqueue_copy(q_copy, target, host).wait()  # first touch of the pages, not measured
    busy = cl.Kernel(prg, "busy")
    busy(q_run, (n,), None, work, np.int32(1))  # PoCL compiles a kernel at its first run
    q_run.finish()
    k = busy(q_run, (n,), None, work, np.int32(iters))
    q_run.flush()
    c = cl.enqueue_copy(q_copy, target, host, is_blocking=False)
    k.wait()
    c.wait()
    ks, ke = k.profile.start, k.profile.end
    cs, ce = c.profile.start, c.profile.end
    shared = max(0, min(ke, ce) - max(ks, cs))
    return {
        "overlap": shared > 0,
        "kernel_ms": (ke - ks) / 1e6,
        "copy_ms": (ce - cs) / 1e6,
        "shared_ms": shared / 1e6,
    }
