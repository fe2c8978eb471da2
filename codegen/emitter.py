"""The emitter interface: the back half of the code generator, one per device language.

An emitter turns a ``KernelSpec`` (``codegen/program.py``) into source text. The front half
has already lowered the ONNX ops to primitives and linearized them into SSA steps, so an
emitter only says how a primitive is spelled (``unary``/``binary``/``compare`` tables and
``select``), how a constant is written, and how the kernel and its loop over ``outer x
inner`` elements look. ``CEmitter`` (host C, built by ``codegen/build.py``) and
``OpenCLEmitter`` are the two here; a CUDA emitter is one more subclass with CUDA's spelling
of the loop (``blockIdx``/``threadIdx``) and of the math (``expf``, ``erff``, ``tanhf``).
"""

from __future__ import annotations

import math

from anychip.codegen.program import KernelSpec, Step, linearize

__all__ = ["Emitter"]


class Emitter:
    """Base class: prints the steps; subclasses print the kernel around them."""

    #: Short name (``c``, ``opencl``), part of cache keys.
    name = "?"
    #: The element type spelled in this language, by dtype name.
    ctypes = {"float32": "float", "float64": "double"}

    def source(self, spec: KernelSpec) -> str:
        """The whole translation unit for ``spec``."""
        raise NotImplementedError

    # -- pieces a subclass may change ------------------------------------------------------
    def literal(self, value: float, ctype: str) -> str:
        """A constant of type ``ctype`` (NaN and infinities by name)."""
        if math.isnan(value):
            return f"(({ctype})NAN)"
        if math.isinf(value):
            return f"(({ctype})INFINITY)" if value > 0 else f"(-({ctype})INFINITY)"
        text = repr(float(value))
        return f"{text}f" if ctype == "float" else text

    def suffix(self, ctype: str) -> str:
        """The math functions' suffix for ``ctype`` (C: ``expf``; OpenCL's are overloaded)."""
        return "f" if ctype == "float" else ""

    def unary(self, op: str, a: str, ctype: str) -> str:
        """A unary primitive applied to ``a``."""
        f = self.suffix(ctype)
        one = self.literal(1.0, ctype)
        table = {
            "neg": f"(-{a})",
            "abs": f"fabs{f}({a})",
            "exp": f"exp{f}({a})",
            "log": f"log{f}({a})",
            "sqrt": f"sqrt{f}({a})",
            "tanh": f"tanh{f}({a})",
            "erf": f"erf{f}({a})",
            "sigmoid": f"({one} / ({one} + exp{f}(-{a})))",
            "recip": f"({one} / {a})",
        }
        return table[op]

    def binary(self, op: str, a: str, b: str, ctype: str) -> str:
        """A binary primitive; ``max``/``min`` propagate NaN from either side."""
        f = self.suffix(ctype)
        table = {
            "add": f"({a} + {b})",
            "sub": f"({a} - {b})",
            "mul": f"({a} * {b})",
            "div": f"({a} / {b})",
            "max": f"(({a} > {b} || {a} != {a}) ? {a} : {b})",
            "min": f"(({a} < {b} || {a} != {a}) ? {a} : {b})",
            "pow": f"pow{f}({a}, {b})",
        }
        return table[op]

    def compare(self, op: str, a: str, b: str) -> str:
        sym = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=="}[op]
        return f"({a} {sym} {b})"

    def read(self, k: int, cls: str) -> str:
        """Input ``k`` at the current element, by broadcast class (names of ``loop``)."""
        return {"F": f"in{k}[base + i]", "S": f"s{k}", "R": f"r{k}", "I": f"in{k}[i]"}[cls]

    def per_element(self, spec: KernelSpec, ctype: str, long_t: str, index: str) -> list[str]:
        """The body of a one-work-item-per-element kernel (OpenCL, CUDA): ``g`` the flat output
        index from ``index``, its ``(o, i)`` split, the scalar and per-row inputs, the steps
        and the store; ``long_t`` the device language's 64-bit integer type."""
        lines = [
            f"    const {long_t} g = {index};",
            "    if (g >= outer * inner) return;",
            f"    const {long_t} o = g / inner;",
            f"    const {long_t} i = g - o * inner;",
            f"    const {long_t} base = o * inner;",
        ]
        for k, c in enumerate(spec.classes):
            if c == "S":
                lines.append(f"    const {ctype} s{k} = in{k}[0];")
            elif c == "R":
                lines.append(f"    const {ctype} r{k} = in{k}[o % m{k}];")
        body = self.body(spec, "    ")
        return lines + body + [f"    out[g] = t{len(body) - 1};", "}", ""]

    def body(self, spec: KernelSpec, indent: str) -> list[str]:
        """The statements computing one output element into ``t<last>``."""
        ctype = self.ctypes[spec.dtype]
        lines: list[str] = []
        for n, step in enumerate(linearize(spec.expr)):
            lines.append(f"{indent}const {ctype} t{n} = {self.step(step, spec, ctype)};")
        return lines

    def step(self, step: Step, spec: KernelSpec, ctype: str) -> str:
        t = [f"t{i}" for i in step.args]
        if step.op == "in":
            return self.read(int(step.value), spec.classes[int(step.value)])
        if step.op == "const":
            return self.literal(float(step.value), ctype)
        if step.op == "select":
            return f"({t[0]} ? {t[1]} : {t[2]})"
        if len(t) == 1:
            return self.unary(step.op, t[0], ctype)
        if step.op in ("lt", "le", "gt", "ge", "eq"):
            return self.compare(step.op, t[0], t[1])
        return self.binary(step.op, t[0], t[1], ctype)
