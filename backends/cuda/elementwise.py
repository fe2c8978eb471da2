"""Fused element-wise chains as CUDA source: a small self-contained emitter.

The input form is a ``Chain``: ``n_inputs`` operands, then ``steps``, each an ONNX element-wise
op applied to earlier operands (indices ``0..n_inputs-1`` are the kernel's inputs, index
``n_inputs + j`` is step ``j``'s result), and the operand indices that are ``outputs``. A
graph front half (the CPU code generator's, which groups element-wise runs of a partition)
hands over exactly this: a topologically ordered list of (op, operand indices, attributes).

Two emitters read it:

* ``elementwise_parts(chain)`` gives ``(in_params, out_params, body)`` for CuPy's
  ``ElementwiseKernel``, which broadcasts its operands and handles float16 (the body computes
  in float and converts at the end);
* ``raw_source(chain, name)`` gives a whole ``extern "C" __global__`` kernel over contiguous,
  same-shape float32/float64 operands for ``RawKernel`` or NVRTC directly
  (``nvrtc.compile_ptx`` compiles it with the NVRTC wheel, no GPU needed).

``FusedElementwise`` builds and caches the CuPy kernel of a chain (needs a GPU to run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from anychip.errors import KernelError

__all__ = [
    "Step", "Chain", "OPS", "body_lines", "elementwise_parts", "raw_source", "FusedElementwise",
]  # fmt: skip


@dataclass(frozen=True)
class Step:
    """One op of a chain: ``op`` (ONNX name) on operand indices ``args``, with ``attrs``."""

    op: str
    args: tuple[int, ...]
    attrs: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Chain:
    """A fused element-wise chain (see the module docstring)."""

    n_inputs: int
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    dtype: str = "float32"
    _checked: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.dtype not in ("float16", "float32", "float64"):
            raise KernelError(f"a fused chain computes float16/32/64, not {self.dtype}")
        for j, st in enumerate(self.steps):
            if st.op not in OPS:
                raise KernelError(f"no CUDA expression for {st.op} (have: {sorted(OPS)})")
            arity = OPS[st.op][0]
            if len(st.args) != arity:
                raise KernelError(f"{st.op} takes {arity} operand(s), got {len(st.args)}")
            if any(not 0 <= a < self.n_inputs + j for a in st.args):
                raise KernelError(f"step {j} ({st.op}) reads an operand not yet computed")
        top = self.n_inputs + len(self.steps)
        if not self.outputs or any(not 0 <= o < top for o in self.outputs):
            raise KernelError(f"outputs {self.outputs} are not operands of the chain")


def _num(v: float) -> str:
    if math.isinf(v):
        return "((C)-1e308 * (C)1e308)" if v < 0 else "((C)1e308 * (C)1e308)"
    return f"((C){float(v)!r})"


#: op -> (arity, expression over a, b and the attributes, with the attributes' defaults)
OPS: dict[str, tuple[int, str, dict[str, float]]] = {
    "Add": (2, "a + b", {}), "Sub": (2, "a - b", {}), "Mul": (2, "a * b", {}),
    "Div": (2, "a / b", {}), "Pow": (2, "pow(a, b)", {}), "Max": (2, "fmax(a, b)", {}),
    "Min": (2, "fmin(a, b)", {}), "Neg": (1, "-a", {}), "Abs": (1, "fabs(a)", {}),
    "Exp": (1, "exp(a)", {}), "Log": (1, "log(a)", {}), "Sqrt": (1, "sqrt(a)", {}),
    "Reciprocal": (1, "(C)1 / a", {}), "Floor": (1, "floor(a)", {}), "Ceil": (1, "ceil(a)", {}),
    "Sin": (1, "sin(a)", {}), "Cos": (1, "cos(a)", {}), "Tanh": (1, "tanh(a)", {}),
    "Erf": (1, "erf(a)", {}), "Sigmoid": (1, "(C)1 / ((C)1 + exp(-a))", {}),
    "Relu": (1, "(a < (C)0 ? (C)0 : a)", {}),
    "LeakyRelu": (1, "(a < (C)0 ? a * {alpha} : a)", {"alpha": 0.01}),
    "Elu": (1, "(a > (C)0 ? a : {alpha} * expm1(a))", {"alpha": 1.0}),
    "HardSigmoid": (1, "fmin((C)1, fmax((C)0, {alpha} * a + {beta}))", {"alpha": 0.2, "beta": 0.5}),
    "HardSwish": (1, "a * fmin((C)1, fmax((C)0, a / (C)6 + (C)0.5))", {}),
    "Softplus": (1, "(fmax(a, (C)0) + log1p(exp(-fabs(a))))", {}),
    "Gelu": (1, "((C)0.5 * a * ((C)1 + erf(a * (C)0.70710678118654752)))", {}),
    "Clip": (1, "fmin(fmax(a, {min}), {max})", {"min": -math.inf, "max": math.inf}),
}  # fmt: skip


def _expr(st: Step, names: list[str]) -> str:
    _, template, defaults = OPS[st.op]
    values = {**defaults, **dict(st.attrs)}
    expr = template.format(**{k: _num(v) for k, v in values.items()})
    a = names[st.args[0]]
    b = names[st.args[1]] if len(st.args) > 1 else ""
    # whole-word substitution of the operands a and b
    out, i = [], 0
    while i < len(expr):
        ch = expr[i]
        prev = expr[i - 1] if i else " "
        nxt = expr[i + 1] if i + 1 < len(expr) else " "
        if ch in "ab" and not (prev.isalnum() or prev == "_") and not (nxt.isalnum() or nxt == "_"):
            out.append(a if ch == "a" else b)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def body_lines(chain: Chain, loads: list[str], stores: list[str]) -> list[str]:
    """Lines computing every step in the compute type ``C`` (a typedef the caller gives) from
    the ``loads`` expressions and assigning the outputs to ``stores`` (converted to ``T``).
    Plain C++ with <cmath>: the tests compile it on the host to check its arithmetic."""
    names = [f"v{i}" for i in range(chain.n_inputs)]
    lines = [f"C v{i} = (C)({src});" for i, src in enumerate(loads)]
    for j, st in enumerate(chain.steps):
        name = f"v{chain.n_inputs + j}"
        lines.append(f"C {name} = {_expr(st, names)};")
        names.append(name)
    lines += [f"{dst} = (T)({names[o]});" for dst, o in zip(stores, chain.outputs)]
    return lines


def _ctype(dtype: str) -> str:
    return "double" if dtype == "float64" else "float"


def elementwise_parts(chain: Chain) -> tuple[str, str, str]:
    """``(in_params, out_params, body)`` for ``cupy.ElementwiseKernel`` (type ``T``)."""
    ins = ", ".join(f"T x{i}" for i in range(chain.n_inputs))
    outs = ", ".join(f"T y{k}" for k in range(len(chain.outputs)))
    lines = [f"typedef {_ctype(chain.dtype)} C;"]
    lines += body_lines(
        chain,
        [f"x{i}" for i in range(chain.n_inputs)],
        [f"y{k}" for k in range(len(chain.outputs))],
    )
    return ins, outs, "\n".join(lines)


def raw_source(chain: Chain, name: str = "fused") -> str:
    """A whole CUDA kernel over contiguous same-shape float32/float64 operands."""
    if chain.dtype == "float16":
        raise KernelError(
            "raw_source takes float32/float64; float16 goes through elementwise_parts"
        )
    t = _ctype(chain.dtype)
    params = [f"const T* __restrict__ x{i}" for i in range(chain.n_inputs)]
    params += [f"T* __restrict__ y{k}" for k in range(len(chain.outputs))]
    params.append("const long long n")
    body = body_lines(
        chain,
        [f"x{i}[i]" for i in range(chain.n_inputs)],
        [f"y{k}[i]" for k in range(len(chain.outputs))],
    )
    inner = "\n".join("        " + line for line in body)
    return (
        f"typedef {t} T;\ntypedef {t} C;\n"
        f'extern "C" __global__ void {name}({", ".join(params)}) {{\n'
        "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
        "         i += (long long)gridDim.x * blockDim.x) {\n"
        f"{inner}\n    }}\n}}\n"
    )


class FusedElementwise:
    """A chain as a callable on CuPy arrays (broadcasting, float16 included); built once."""

    def __init__(self, chain: Chain, name: str = "anychip_fused") -> None:
        self.chain = chain
        self.name = name
        self._kernel: Any = None

    def __call__(self, *arrays: Any) -> Any:
        if self._kernel is None:
            import cupy

            ins, outs, body = elementwise_parts(self.chain)
            self._kernel = cupy.ElementwiseKernel(ins, outs, body, self.name)
        return self._kernel(*arrays)
