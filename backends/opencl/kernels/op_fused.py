"""``anychip::FusedElementwise`` on OpenCL: a fused element-wise chain as one kernel launch.

The shared ``FuseElementwisePass`` (``ir/passes/patterns``) also runs on OpenCL partitions
(``backends/opencl/__init__.py``), so a chain such as bias + GELU or x*sigmoid(x) that would
be one launch per op (20-100 us each on PoCL) is one launch. The source is the code
generator's OpenCL emitter (``anychip.codegen.OpenCLEmitter``) over the same front half the
CPU's generated C uses; one program is built per (expression, element type, broadcast
classes) and kept by the device's ``ProgramCache`` (binaries on disk like every family).
An input whose broadcast fits none of the emitter's classes is expanded on the device first.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from anychip.backends.opencl.driver import ClTensor
from anychip.backends.opencl.kernels._common import ctype, dev, launch
from anychip.backends.opencl.kernels.op_data import broadcast_to
from anychip.backends.opencl.kernels.table import kernel
from anychip.codegen import KernelSpec, classify, parse
from anychip.codegen.opencl_emitter import OpenCLEmitter
from anychip.errors import KernelError
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["fused_elementwise", "fused_source"]

_EMITTER = OpenCLEmitter()


@lru_cache(maxsize=1024)
def fused_source(expr: str, dtype: str, classes: tuple[str, ...]) -> tuple[str, str]:
    """The program family name and OpenCL C source of ``expr`` for one layout."""
    src = _EMITTER.source(KernelSpec(parse(expr), dtype, classes))
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]
    return f"fused_{digest}", src


@kernel("FusedElementwise", domain=ANYCHIP_DOMAIN, since=1, dtypes={DType.FLOAT, DType.DOUBLE})
def fused_elementwise(*xs: ClTensor, expr: str) -> ClTensor:
    """``expr`` over ``xs`` (numpy broadcasting) in one launch."""
    d = dev(*xs)
    dtype = xs[0].dtype
    if any(x.dtype != dtype for x in xs):
        raise KernelError(f"FusedElementwise: inputs of mixed types {[str(x.dtype) for x in xs]}")
    ct = ctype(dtype, "FusedElementwise")
    try:
        shape = tuple(np.broadcast_shapes(*(x.shape for x in xs)))
    except ValueError:
        raise KernelError(
            f"FusedElementwise: shapes {[list(x.shape) for x in xs]} do not broadcast"
        ) from None
    layout = classify([tuple(x.shape) for x in xs], shape)
    temps = [broadcast_to(x, shape) for x, c in zip(xs, layout.classes) if c == "X"]
    it = iter(temps)
    ins = [next(it) if c == "X" else x for x, c in zip(xs, layout.classes)]
    classes = layout.built
    family, src = fused_source(expr, np.dtype(dtype).name, classes)
    y = d.empty(shape, dtype)
    n = layout.outer * layout.inner
    try:
        if n > 0:
            args = [np.int64(layout.outer), np.int64(layout.inner)]
            args += [x.buffer for x in ins]
            args += [np.int64(m) for m in layout.r_mods]
            args.append(y.buffer)
            wg = d.wg
            launch(d, family, ct, "anychip_fused", lambda: src, [-(-n // wg) * wg], args, [wg])
    finally:
        for t in temps:
            t.release()
    return y
