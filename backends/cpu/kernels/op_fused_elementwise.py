"""``anychip::FusedElementwise``: a fused element-wise chain (``ir/passes/patterns``) run as
generated C (``anychip.codegen``), or with numpy when no C compiler is present.

The numpy path (``evaluate``) computes each primitive with the same formula as the CPU's own
kernels (erf through ``op_elementwise.erf_array``), so a fused chain without a compiler gives
what the unfused nodes give. The C path reads each input by its broadcast class
(``codegen/program.classify``); an input no class fits is broadcast to the full shape first.
The result goes into the planned ``out`` when the executor hands one, which may be the first
input's own memory (registered ``inplace``: element i of the output reads element i of a
full-shape first input only; the C takes no ``restrict`` on that pair).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.kernels.op_elementwise import ieee_power
from anychip.backends.cpu.native.fused import c_kernel
from anychip.backends.cpu.replay import record as _replay
from anychip.backends.cpu.table import kernel
from anychip.codegen import KernelSpec, classify, parse
from anychip.codegen.expr import Expr
from anychip.codegen.program import linearize
from anychip.core.plugin.reference.erf import erf_array
from anychip.errors import KernelError
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["fused_elementwise", "evaluate", "forget_plans", "elementwise_call"]

_UNARY = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "erf": erf_array,
    "recip": np.reciprocal,
}
_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": ieee_power,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
}


def evaluate(expr: Expr, inputs: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """``expr`` over ``inputs`` with numpy, in ``dtype`` (the numpy fallback)."""
    vals: list = []
    one = dtype.type(1)
    with np.errstate(all="ignore"):
        for s in linearize(expr):
            a = [vals[i] for i in s.args]
            if s.op == "in":
                vals.append(inputs[int(s.value)])
            elif s.op == "const":
                vals.append(dtype.type(s.value))
            elif s.op == "select":
                vals.append(np.where(a[0], a[1], a[2]))
            elif s.op == "sigmoid":
                vals.append(one / (one + np.exp(-a[0])))
            elif s.op in _UNARY:
                vals.append(_UNARY[s.op](a[0]))
            else:
                vals.append(_BINARY[s.op](a[0], a[1]))
    out = np.broadcast_to(vals[-1], np.broadcast_shapes(*(x.shape for x in inputs)))
    return np.array(out, dtype=dtype)


def _may_write(out: np.ndarray, arrays: list[np.ndarray], classes: tuple[str, ...], fn) -> bool:
    """Whether the kernel may write ``out``: it overlaps no input, or it is exactly the
    first input (read at the same element before it is written: the in-place hint)."""
    first = arrays[0]
    rest = not any(np.may_share_memory(out, x) for x in arrays[1:])
    if not np.may_share_memory(out, first):
        return rest
    if not rest or classes[0] != "F" or first.shape != out.shape:
        return False
    # The same first float: compared as cffi pointers (0.25 us each; ``ctypes.data`` ~1 us,
    # two a call on the planned in-place GELU). Both are C-contiguous here.
    buf, ptr = fn.ffi.from_buffer, fn.ptr
    return buf(ptr, first) == buf(ptr, out)


@lru_cache(maxsize=4096)
def _plan(expr: str, dtype: np.dtype, shapes: tuple) -> tuple:
    """What a call of ``expr`` on inputs of ``shapes`` needs, worked out once: the output
    shape, the layout, and the built C (None: numpy)."""
    e = parse(expr)
    shape = np.broadcast_shapes(*shapes)
    layout = classify(list(shapes), shape)
    spec = KernelSpec(e, dtype.name, layout.built)
    return e, shape, layout, c_kernel(spec)


def elementwise_call(expr: str, dtype: np.dtype, shapes: tuple) -> Any:
    """``expr``'s generated C for C-contiguous inputs of ``shapes`` (no broadcast copies) as
    ``call(arrays, out)``, for a caller that checked its arrays once and calls it again and
    again; None where numpy would run (no compiler, inputs that need a broadcast copy)."""
    _, shape, layout, fn = _plan(expr, dtype, tuple(shapes))
    if fn is None or layout.broadcasts:
        return None
    return lambda arrays, out: fn(layout, arrays, out)


def forget_plans() -> None:
    """Work the plans out again on the next calls (after ``$CC`` changed: tests hide the
    compiler by pointing it at a missing program)."""
    _plan.cache_clear()


@kernel(
    "FusedElementwise",
    domain=ANYCHIP_DOMAIN,
    since=1,
    dtypes=(DType.FLOAT, DType.DOUBLE),
    inplace=True,
)
def fused_elementwise(*xs: np.ndarray, expr: str, out: np.ndarray | None = None) -> np.ndarray:
    """``expr`` over ``xs`` (numpy broadcasting), as generated C where it can be built."""
    y, noted = evaluate_into(xs, expr, out)
    if noted and _replay.ACTIVE:  # the one call of generated C (noted there): all it did
        _replay.seal()
    return y


def evaluate_into(
    xs: Sequence[np.ndarray], expr: str, out: np.ndarray | None
) -> tuple[np.ndarray, bool]:
    """``fused_elementwise``'s result, in ``out`` where it fits, and whether one call of
    generated C on ``xs`` themselves made it (nothing else: a replay's note is all of it)."""
    dtype = xs[0].dtype
    for x in xs:
        if x.dtype != dtype:
            types = [str(x.dtype) for x in xs]
            raise KernelError(f"FusedElementwise: inputs of mixed types {types}")
    e, shape, layout, fn = _plan(expr, dtype, tuple([x.shape for x in xs]))
    if fn is None:
        return evaluate(e, list(xs), dtype), False
    if layout.broadcasts:
        arrays = [
            np.ascontiguousarray(np.broadcast_to(x, shape) if c == "X" else x)
            for x, c in zip(xs, layout.classes)
        ]
    else:  # the common case, a few us a call cheaper on small transformer tensors
        arrays = [x if x.flags.c_contiguous else np.ascontiguousarray(x) for x in xs]
    if not fits(out, shape, dtype) or not _may_write(out, arrays, layout.classes, fn):
        out = _replay.empty(
            shape, dtype
        )  # np.empty, or the recorder's (backends/cpu/replay/record.py)
    if out.size:
        fn(layout, arrays, out)  # generated C, noted (``codegen.CFunction``)
    return out, all(a is x for a, x in zip(arrays, xs))
