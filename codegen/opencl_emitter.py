"""The OpenCL C emitter: the same steps as the C emitter, one work-item per output element.

OpenCL C's math builtins are overloaded (``exp``, ``tanh``, ``erf`` for float and double), so
the primitives are spelled without C's ``f`` suffixes; NaN/Inf semantics are the device's
IEEE ones as long as the program is built without ``-cl-fast-relaxed-math`` /
``-cl-finite-math-only``. A launch covers ``outer * inner`` work-items (``get_global_id(0)``
is the flat output index); arguments are the C kernel's, as ``__global`` buffers and
``long`` scalars.
"""

from __future__ import annotations

from anychip.codegen.emitter import Emitter
from anychip.codegen.program import KernelSpec, Step

__all__ = ["OpenCLEmitter"]


class OpenCLEmitter(Emitter):
    """``__kernel void anychip_fused(long outer, long inner, __global const T *in0, ...,
    long m<k> (R inputs), __global T *out)``."""

    name = "opencl"

    def suffix(self, ctype: str) -> str:
        return ""

    def step(self, step: Step, spec: KernelSpec, ctype: str) -> str:
        # A comparison's result is kept as a 0/1 of the element type, and OpenCL C (unlike
        # C) takes no floating-point value as the condition of ``?:``.
        if step.op == "select":
            c, a, b = (f"t{i}" for i in step.args)
            return f"({c} != ({ctype})0 ? {a} : {b})"
        return super().step(step, spec, ctype)

    def source(self, spec: KernelSpec) -> str:
        ctype = self.ctypes[spec.dtype]
        lines = []
        if ctype == "double":
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        params = ["const long outer", "const long inner"]
        params += [f"__global const {ctype} *restrict in{k}" for k in range(len(spec.classes))]
        params += [f"const long m{k}" for k, c in enumerate(spec.classes) if c == "R"]
        params.append(f"__global {ctype} *restrict out")
        lines.append(f"__kernel void {spec.name}({', '.join(params)}) {{")
        lines += self.per_element(spec, ctype, "long", "get_global_id(0)")
        return "\n".join(lines)
