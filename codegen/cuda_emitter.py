"""The CUDA emitter: the front half's steps as one ``extern "C" __global__`` kernel, one thread
per output element, for CuPy's ``RawKernel`` or NVRTC directly (``backends/cuda/nvrtc.py``
compiles it with the NVRTC wheel on a machine without a GPU).

The math functions are CUDA's own device functions with C's spelling (``expf``, ``erff``,
``tanhf``; the double forms unsuffixed), IEEE-exact as long as the kernel is not compiled
with ``--use_fast_math`` (which nothing here passes). NVRTC compiles without headers, so NaN
and infinities are written from their bit patterns instead of ``NAN``/``INFINITY``. The
launch covers ``outer * inner`` threads; arguments are the C kernel's: ``outer``, ``inner``,
the inputs, one modulus per ``R`` input, the output.
"""

from __future__ import annotations

import math

from anychip.codegen.emitter import Emitter
from anychip.codegen.program import KernelSpec

__all__ = ["CUDAEmitter"]

_BITS = {
    "float": ("__int_as_float", "0x7fc00000", "0x7f800000"),
    "double": ("__longlong_as_double", "0x7ff8000000000000LL", "0x7ff0000000000000LL"),
}


class CUDAEmitter(Emitter):
    """``extern "C" __global__ void anychip_fused(long long outer, long long inner,
    const T *in0, ..., long long m<k> (R inputs), T *out)``."""

    name = "cuda"

    def literal(self, value: float, ctype: str) -> str:
        if math.isnan(value) or math.isinf(value):
            fn, nan, inf = _BITS[ctype]
            if math.isnan(value):
                return f"{fn}({nan})"
            return f"{fn}({inf})" if value > 0 else f"(-{fn}({inf}))"
        return super().literal(value, ctype)

    def source(self, spec: KernelSpec) -> str:
        ctype = self.ctypes[spec.dtype]
        params = ["const long long outer", "const long long inner"]
        params += [f"const {ctype} *__restrict__ in{k}" for k in range(len(spec.classes))]
        params += [f"const long long m{k}" for k, c in enumerate(spec.classes) if c == "R"]
        params.append(f"{ctype} *__restrict__ out")
        lines = [f'extern "C" __global__ void {spec.name}({", ".join(params)}) {{']
        index = "(long long)blockIdx.x * blockDim.x + threadIdx.x"
        lines += self.per_element(spec, ctype, "long long", index)
        return "\n".join(lines)
