"""Reductions, MatMul/Gemm, Softmax, LayerNormalization, BatchNormalization and Attention of
the array-API family. Normalizations of float16/bfloat16 compute in float32 (ONNX's
``stash_type``), as onnxruntime does.
"""

from __future__ import annotations

import math
from typing import Any

from anychip.backends.arrayapi.family._common import NUM, F, ints, kernel, norm_axis
from anychip.backends.arrayapi.family.op_elementwise import _wide
from anychip.backends.arrayapi.tensor import Space
from anychip.errors import KernelError

__all__ = ["reduce", "softmax_of"]


def _axes(axes: list[int] | None, rank: int, noop: int, op: str) -> tuple[int, ...] | None:
    """Normalized reduction axes; None means no reduction (``noop_with_empty_axes``)."""
    if not axes:
        return None if noop else tuple(range(rank))
    return tuple(sorted({norm_axis(a, rank, op) for a in axes}))


def _empty_value(op: str) -> float:
    return {"ReduceMax": -math.inf, "ReduceMin": math.inf, "ReduceProd": 1.0,
            "ReduceLogSumExp": -math.inf, "ReduceLogSum": -math.inf,
            "ReduceMean": math.nan}.get(op, 0.0)  # fmt: skip


def reduce(s: Space, op: str, x: Any, axes: tuple[int, ...], keep: bool) -> Any:
    """One ONNX reduction of ``x`` over ``axes`` (the empty-set cases included)."""
    xp = s.xp
    if any(x.shape[a] == 0 for a in axes):
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
        return xp.full(shape, _empty_value(op), dtype=x.dtype, device=s.device)
    kw = {"axis": axes, "keepdims": keep}
    if op == "ReduceSum":
        return xp.sum(x, dtype=x.dtype, **kw)
    if op == "ReduceMean":
        return xp.mean(x, **kw)
    if op == "ReduceMax":
        return xp.max(x, **kw)
    if op == "ReduceMin":
        return xp.min(x, **kw)
    if op == "ReduceProd":
        return xp.prod(x, dtype=x.dtype, **kw)
    if op == "ReduceL1":
        return xp.sum(xp.abs(x), dtype=x.dtype, **kw)
    if op == "ReduceL2":
        return xp.sqrt(xp.sum(x * x, **kw))
    if op == "ReduceSumSquare":
        return xp.sum(x * x, dtype=x.dtype, **kw)
    if op == "ReduceLogSum":
        return xp.log(xp.sum(x, **kw))
    if op == "ReduceLogSumExp":
        m = xp.max(x, axis=axes, keepdims=True)
        m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
        out = xp.log(xp.sum(xp.exp(x - m), axis=axes, keepdims=True)) + m
        return out if keep else xp.squeeze(out, axis=axes)
    raise KernelError(f"no reduction {op}")  # pragma: no cover - the table lists the ops


#: op -> (dtypes, version from which axes are an input)
_REDUCE = {
    "ReduceSum": (NUM, 13), "ReduceMean": (F, 18), "ReduceMax": (NUM, 18),
    "ReduceMin": (NUM, 18), "ReduceProd": (NUM, 18), "ReduceL1": (F, 18), "ReduceL2": (F, 18),
    "ReduceSumSquare": (F, 18), "ReduceLogSum": (F, 18), "ReduceLogSumExp": (F, 18),
}  # fmt: skip
_UNTIL = {"ReduceMax": 20, "ReduceMin": 20}


def _register_reduce(op: str, dtypes: frozenset, v_input: int) -> None:
    def with_attr(s: Space, x: Any, *, axes: list[int] | None = None, keepdims: int = 1) -> Any:
        ax = _axes(axes, len(x.shape), 0, op)
        return reduce(s, op, x, ax, bool(keepdims))

    def with_input(
        s: Space, x: Any, axes: Any = None, *, keepdims: int = 1, noop_with_empty_axes: int = 0
    ) -> Any:
        ax = _axes(ints(s, axes), len(x.shape), noop_with_empty_axes, op)
        if ax is None:
            return s.xp.asarray(x, copy=True)
        return reduce(s, op, x, ax, bool(keepdims))

    kernel(op, since=1, until=v_input - 1, dtypes=dtypes)(with_attr)
    kernel(op, since=v_input, until=_UNTIL.get(op, v_input), dtypes=dtypes)(with_input)


for _op, (_dt, _v) in _REDUCE.items():
    _register_reduce(_op, _dt, _v)


def _register_arg(op: str) -> None:
    def run(
        s: Space, x: Any, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0
    ) -> Any:
        xp = s.xp
        a = norm_axis(axis, len(x.shape), op)
        fn = xp.argmax if op == "ArgMax" else xp.argmin
        if select_last_index:
            n = x.shape[a]
            idx = fn(xp.flip(x, axis=a), axis=a, keepdims=bool(keepdims))
            return xp.astype(n - 1 - idx, xp.int64)
        return xp.astype(fn(x, axis=a, keepdims=bool(keepdims)), xp.int64)

    kernel(op, since=1, until=13, dtypes=NUM)(run)


for _op in ("ArgMax", "ArgMin"):
    _register_arg(_op)


def softmax_of(s: Space, x: Any, axis: int, *, log: bool = False) -> Any:
    """Softmax (or LogSoftmax) of ``x`` along ``axis``, max-shifted."""
    xp = s.xp
    w, back = _wide(s, x)
    z = w - xp.max(w, axis=axis, keepdims=True)
    if log:
        out = z - xp.log(xp.sum(xp.exp(z), axis=axis, keepdims=True))
    else:
        e = xp.exp(z)
        out = e / xp.sum(e, axis=axis, keepdims=True)
    return out if back is None else xp.astype(out, back)


def _flat_softmax(s: Space, x: Any, axis: int, log: bool) -> Any:
    shape = tuple(x.shape)
    a = norm_axis(axis, len(shape), "Softmax")
    rows = math.prod(shape[:a])
    flat = s.xp.reshape(x, (rows, math.prod(shape[a:])))
    return s.xp.reshape(softmax_of(s, flat, 1, log=log), shape)


def _register_softmax(op: str, log: bool) -> None:
    def v1(s: Space, x: Any, *, axis: int = 1) -> Any:
        return _flat_softmax(s, x, axis, log)

    def v13(s: Space, x: Any, *, axis: int = -1) -> Any:
        return softmax_of(s, x, norm_axis(axis, len(x.shape), op), log=log)

    kernel(op, since=1, until=12)(v1)
    kernel(op, since=13, until=13)(v13)


_register_softmax("Softmax", False)
_register_softmax("LogSoftmax", True)


@kernel("MatMul", since=1, until=13)
def matmul(s: Space, a: Any, b: Any) -> Any:
    return s.xp.matmul(a, b)


@kernel("Gemm", since=7, until=13)
def gemm(
    s: Space, a: Any, b: Any, c: Any = None, *, alpha: float = 1.0, beta: float = 1.0,
    transA: int = 0, transB: int = 0,
) -> Any:  # fmt: skip
    xp = s.xp
    y = xp.matmul(xp.matrix_transpose(a) if transA else a, xp.matrix_transpose(b) if transB else b)
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0.0:
        y = y + (c * beta if beta != 1.0 else c)
    return y


@kernel("LayerNormalization", since=17, until=17, context=True)
def layer_normalization(
    ctx: Any, s: Space, x: Any, scale: Any, bias: Any = None, *, axis: int = -1,
    epsilon: float = 1e-5, stash_type: int = 1,
) -> Any:  # fmt: skip
    xp = s.xp
    a = norm_axis(axis, len(x.shape), "LayerNormalization")
    axes = tuple(range(a, len(x.shape)))
    w, back = _wide(s, x)
    mean = xp.mean(w, axis=axes, keepdims=True)
    d = w - mean
    inv = 1.0 / xp.sqrt(xp.mean(d * d, axis=axes, keepdims=True) + epsilon)
    y = d * inv
    y = xp.astype(y, x.dtype) if back is not None else y
    y = y * scale
    if bias is not None:
        y = y + bias
    outs = (y, mean, inv)[: ctx.num_outputs]  # Mean and InvStdDev in float32 (stash_type)
    if len(outs) == 1:
        return outs[0]
    return tuple(o if used else None for o, used in zip(outs, ctx.outputs_used))


@kernel("BatchNormalization", since=9, until=15, context=True)
def batch_normalization(
    ctx: Any, s: Space, x: Any, scale: Any, b: Any, mean: Any, var: Any, *,
    epsilon: float = 1e-5, momentum: float = 0.9, training_mode: int = 0,
) -> Any:  # fmt: skip
    """Inference, or (``training_mode=1``) batch statistics and updated running figures."""
    xp = s.xp
    shape = (1, -1) + (1,) * (len(x.shape) - 2) if len(x.shape) > 1 else (-1,)
    p = [xp.reshape(xp.astype(t, x.dtype), shape) for t in (scale, b, mean, var)]
    if not training_mode:
        return (x - p[2]) * (p[0] / xp.sqrt(p[3] + epsilon)) + p[1]
    axes = (0, *range(2, len(x.shape)))
    bm = xp.mean(x, axis=axes, keepdims=True)
    bv = xp.mean((x - bm) * (x - bm), axis=axes, keepdims=True)
    y = (x - bm) * (p[0] / xp.sqrt(bv + epsilon)) + p[1]
    run_m = xp.reshape(p[2] * momentum + bm * (1.0 - momentum), mean.shape)
    run_v = xp.reshape(p[3] * momentum + bv * (1.0 - momentum), var.shape)
    return (y, xp.astype(run_m, mean.dtype), xp.astype(run_v, var.dtype))[: ctx.num_outputs]
