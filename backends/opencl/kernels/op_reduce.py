"""Reductions (ReduceSum/Mean/Max/Min/Prod/SumSquare/L1/L2/LogSum/LogSumExp), and
GlobalAveragePool/GlobalMaxPool as reductions over the spatial axes.

One work-item per output element walks the reduced elements through a table of kept and
reduced (shape, stride) pairs, accumulating in the element type; LogSumExp subtracts the
maximum first. Reducing an empty set gives the op's identity (0, 1, -inf, +inf), as ONNX's
reference does.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.opencl.driver import ClTensor
from anychip.backends.opencl.kernels._common import (
    collapse,
    contiguous_strides,
    ctype,
    dev,
    ints,
    launch1d,
    norm_axis,
)
from anychip.backends.opencl.kernels.table import F, kernel

__all__ = ["reduce", "REDUCE"]

#: op -> (init, accumulate "acc = f(acc, v)", finish f(acc, count))
REDUCE = {
    "ReduceSum": ("(T)0", "acc + v", "acc"),
    "ReduceMean": ("(T)0", "acc + v", "acc / (T)cnt"),
    "ReduceMax": ("-INFINITY", "(v > acc || isnan(v)) ? v : acc", "acc"),
    "ReduceMin": ("INFINITY", "(v < acc || isnan(v)) ? v : acc", "acc"),
    "ReduceProd": ("(T)1", "acc * v", "acc"),
    "ReduceSumSquare": ("(T)0", "acc + v * v", "acc"),
    "ReduceL1": ("(T)0", "acc + fabs(v)", "acc"),
    "ReduceL2": ("(T)0", "acc + v * v", "sqrt(acc)"),
    "ReduceLogSum": ("(T)0", "acc + v", "log(acc)"),
    "ReduceLogSumExp": ("(T)0", "acc + exp(v - mx)", "log(acc) + mx"),
}

_WALK = (
    "int nk = m[0]; int r = i; int base = 0; "
    "for (int d = nk - 1; d >= 0; --d) { int s = m[1 + d]; int q = r % s; r /= s; "
    "base += q * m[1 + nk + d]; } "
    "int nr = m[1 + 2 * nk]; __global const int* rm = m + 2 + 2 * nk; "
)
_OFF = (
    "int rr = j; int off = base; for (int d = nr - 1; d >= 0; --d) { int s = rm[d]; "
    "int q = rr % s; rr /= s; off += q * rm[nr + d]; } T v = x[off];"
)


def _source() -> str:
    parts = []
    for op, (init, acc, fin) in REDUCE.items():
        pre = ""
        if op == "ReduceLogSumExp":
            pre = (
                f"T mx = -INFINITY; for (int j = 0; j < cnt; ++j) {{ {_OFF} mx = fmax(mx, v); }}"
                " if (isinf(mx)) mx = (T)0; "
            )
        parts.append(
            f"__kernel void k_{op}(__global const T* x, __global T* y, __global const int* m, "
            f"int cnt, int n) {{ int i = get_global_id(0); if (i >= n) return; {_WALK} {pre}"
            f"T acc = {init}; for (int j = 0; j < cnt; ++j) {{ {_OFF} acc = {acc}; }} "
            f"y[i] = {fin}; }}"
        )
    return "\n".join(parts)


def reduce(op: str, x: ClTensor, axes: list[int] | None, keepdims: bool) -> ClTensor:
    """``op`` over ``axes`` (None or empty: all axes) of ``x``."""
    d = dev(x)
    ct = ctype(x.dtype, op)
    red = sorted({norm_axis(a, x.ndim, op) for a in axes}) if axes else list(range(x.ndim))
    st = contiguous_strides(x.shape)
    kept = [i for i in range(x.ndim) if i not in red]
    out = (
        [1 if i in red else s for i, s in enumerate(x.shape)]
        if keepdims
        else [x.shape[i] for i in kept]
    )
    y = d.empty(tuple(out), x.dtype)
    cnt = int(np.prod([x.shape[i] for i in red], dtype=np.int64))
    kdims, (kst,) = collapse([x.shape[i] for i in kept], [[st[i] for i in kept]])
    rdims, (rst,) = collapse([x.shape[i] for i in red], [[st[i] for i in red]])
    meta = d.meta((len(kdims), *kdims, *kst, len(rdims), *rdims, *rst))
    args = [x.buffer, y.buffer, meta, np.int32(cnt)]
    launch1d(d, "reduce", ct, f"k_{op}", _source, y.size, args)
    return y


def _with_attr(op: str):
    def fn(x: ClTensor, *, axes: list[int] | None = None, keepdims: int = 1) -> ClTensor:
        return reduce(op, x, axes, bool(keepdims))

    fn.__name__ = f"opencl_{op.lower()}_attr"
    return fn


def _with_input(op: str):
    def fn(
        x: ClTensor, axes: ClTensor | None = None, *, keepdims: int = 1,
        noop_with_empty_axes: int = 0,
    ) -> ClTensor:  # fmt: skip
        got = ints(axes) if axes is not None else []
        if not got and noop_with_empty_axes:
            return dev(x).copy(x)
        return reduce(op, x, got, bool(keepdims))

    fn.__name__ = f"opencl_{op.lower()}"
    return fn


for _op in REDUCE:
    _moved = 13 if _op == "ReduceSum" else 18
    kernel(_op, since=1, until=_moved - 1, dtypes=F)(_with_attr(_op))
    kernel(_op, since=_moved, dtypes=F)(_with_input(_op))


@kernel("GlobalAveragePool", since=1, dtypes=F)
def global_average_pool(x: ClTensor) -> ClTensor:
    return reduce("ReduceMean", x, list(range(2, x.ndim)), True)


@kernel("GlobalMaxPool", since=1, dtypes=F)
def global_max_pool(x: ClTensor) -> ClTensor:
    return reduce("ReduceMax", x, list(range(2, x.ndim)), True)
