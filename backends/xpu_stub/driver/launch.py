"""Host-side launchers for the XPU driver's C kernels.

Each function takes :class:`~anychip.backends.xpu_stub.driver.XpuTensor` inputs, computes the
output shape and the argument block the C kernel wants (broadcast strides, normalised axes,
slice windows), allocates the output from the same device heap, launches, and returns the
output tensor. Nothing here touches the data on the host: every result is computed in C.

Invariants:
    * Inputs and outputs are dense and row-major; every output is a fresh buffer the caller
      owns, except ``xpu_reshape(..., copy=False)``, which returns a view sharing its input's
      handle (``is_view=True``: free the base, never the view).
    * Arithmetic kernels take float32, and int64 where shape arithmetic needs it (``Relu``,
      ``Neg``, ``Abs``, the binary ops, ``MatMul``, ``ReduceSum/Max/Min``); data movement
      (transpose, slice, concat, expand, reshape) takes any dtype of 1, 2, 4 or 8 bytes.
    * A launch is enqueued; reading a result (``XpuTensor.numpy()``) synchronises.
    * Bad shapes raise ``KernelError``, unsupported dtypes ``UnsupportedDTypeError``, driver
      failures ``DeviceError``/``OutOfMemoryError``; a failed launch frees its output.

Example:
    >>> import numpy as np
    >>> from anychip.backends.xpu_stub.driver import get_driver
    >>> a = get_driver().upload(np.ones((2, 3), np.float32))
    >>> b = get_driver().upload(np.arange(3, dtype=np.float32))
    >>> y = xpu_add(a, b)
    >>> y.numpy().tolist()
    [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
    >>> for t in (a, b, y):
    ...     t.free()
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from anychip.backends.xpu_stub.driver import XpuTensor
from anychip.backends.xpu_stub.driver._launch_util import (
    _FLOAT32,
    _INT64,
    _INT64_UNARY,
    BINARY_OPS,
    REDUCE_OPS,
    UNARY_OPS,
    _broadcast,
    _broadcast_strides,
    _dtype_code,
    _elsize,
    _launch,
    _norm_axis,
    _numel,
    _output,
    _same_driver,
    _strides,
)
from anychip.errors import KernelError

__all__ = [
    "UNARY_OPS",
    "BINARY_OPS",
    "REDUCE_OPS",
    "xpu_unary",
    "xpu_binary",
    "xpu_add",
    "xpu_sub",
    "xpu_mul",
    "xpu_div",
    "xpu_pow",
    "xpu_max",
    "xpu_min",
    "xpu_cast",
    "xpu_matmul",
    "xpu_gemm",
    "xpu_softmax",
    "xpu_layer_norm",
    "xpu_reduce",
    "xpu_transpose",
    "xpu_concat",
    "xpu_slice",
    "xpu_expand",
    "xpu_reshape",
    "xpu_copy",
]


def xpu_unary(
    op: str, x: XpuTensor, *, approximate: str = "none", out: XpuTensor | None = None
) -> XpuTensor:
    """``y = op(x)`` element-wise for an op in :data:`UNARY_OPS`.

    Args:
        op: the ONNX op name.
        x: the input.
        approximate: Gelu's attribute, ``"none"`` (erf form) or ``"tanh"``.
    """
    if op not in UNARY_OPS:
        raise KernelError(f"the XPU has no unary kernel {op!r}; it has {sorted(UNARY_OPS)}")
    code = _dtype_code(op, x.dtype, allow_int64=op in _INT64_UNARY)
    kernel = op
    if op == "Gelu":
        if approximate not in ("none", "tanh"):
            raise KernelError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        kernel = "GeluTanh" if approximate == "tanh" else "Gelu"
    y = _output(x.driver, out, x.shape, x.dtype)
    return _launch(op, kernel, y, [x], [code, x.size])


def xpu_binary(op: str, a: XpuTensor, b: XpuTensor, out: XpuTensor | None = None) -> XpuTensor:
    """``y = a op b`` with numpy broadcasting, for an op in :data:`BINARY_OPS`; into ``out``
    where it fits (planned memory)."""
    if op not in BINARY_OPS:
        raise KernelError(f"the XPU has no binary kernel {op!r}; it has {sorted(BINARY_OPS)}")
    driver = _same_driver(op, [a, b])
    if op == "Pow" and a.dtype == _FLOAT32 and b.dtype == _INT64:
        # ONNX Pow lets the exponent's type differ; an int64 exponent is exact as float32
        # for every value where the float32 power is finite.
        exponent = xpu_cast(b, _FLOAT32)
        try:
            return xpu_binary(op, a, exponent, out)
        finally:
            exponent.free()
    if a.dtype != b.dtype:
        raise KernelError(f"{op}: input dtypes differ ({a.dtype} and {b.dtype}); cast first")
    code = _dtype_code(op, a.dtype)
    shape = _broadcast(op, a.shape, b.shape)
    iargs = [code, len(shape), *shape]
    iargs += _broadcast_strides(a.shape, shape) + _broadcast_strides(b.shape, shape)
    return _launch(op, op, _output(driver, out, shape, a.dtype), [a, b], iargs)


def xpu_add(a: XpuTensor, b: XpuTensor) -> XpuTensor:
    """``a + b`` with broadcasting."""
    return xpu_binary("Add", a, b)


def xpu_sub(a: XpuTensor, b: XpuTensor) -> XpuTensor:
    """``a - b`` with broadcasting."""
    return xpu_binary("Sub", a, b)


def xpu_mul(a: XpuTensor, b: XpuTensor) -> XpuTensor:
    """``a * b`` with broadcasting."""
    return xpu_binary("Mul", a, b)


def xpu_div(a: XpuTensor, b: XpuTensor) -> XpuTensor:
    """``a / b`` with broadcasting; int64 truncates toward zero, ``x / 0`` gives 0."""
    return xpu_binary("Div", a, b)


def xpu_pow(a: XpuTensor, b: XpuTensor) -> XpuTensor:
    """``a ** b`` with broadcasting (same dtype for both)."""
    return xpu_binary("Pow", a, b)


def xpu_max(a: XpuTensor, b: XpuTensor) -> XpuTensor:
    """Element-wise maximum with broadcasting; NaN propagates."""
    return xpu_binary("Max", a, b)


def xpu_min(a: XpuTensor, b: XpuTensor) -> XpuTensor:
    """Element-wise minimum with broadcasting; NaN propagates."""
    return xpu_binary("Min", a, b)


def xpu_cast(x: XpuTensor, dtype: np.dtype | type) -> XpuTensor:
    """Converts between float32 and int64 (float to int truncates toward zero)."""
    target = np.dtype(dtype)
    src = _dtype_code("Cast", x.dtype)
    dst = _dtype_code("Cast", target)
    return _launch("Cast", "Cast", x.driver.empty(x.shape, target), [x], [src, dst, x.size])


# ---- linear algebra --------------------------------------------------------------------------


def xpu_matmul(a: XpuTensor, b: XpuTensor, out: XpuTensor | None = None) -> XpuTensor:
    """numpy.matmul semantics: 1-D operands are promoted and the added axis removed; batch
    dimensions broadcast."""
    driver = _same_driver("MatMul", [a, b])
    if a.dtype != b.dtype:
        raise KernelError(f"MatMul: input dtypes differ ({a.dtype} and {b.dtype}); cast first")
    code = _dtype_code("MatMul", a.dtype)
    if a.ndim == 0 or b.ndim == 0:
        raise KernelError(f"MatMul: inputs must have rank >= 1, got {a.shape} and {b.shape}")
    a_shape = (1, *a.shape) if a.ndim == 1 else a.shape
    b_shape = (*b.shape, 1) if b.ndim == 1 else b.shape
    m, k = a_shape[-2:]
    k2, n = b_shape[-2:]
    if k != k2:
        raise KernelError(f"MatMul: inner dimensions differ: {a.shape} @ {b.shape} ({k} vs {k2})")
    batch = _broadcast("MatMul", a_shape[:-2], b_shape[:-2])
    a_bs = [s * m * k for s in _broadcast_strides(a_shape[:-2], batch)]
    b_bs = [s * k * n for s in _broadcast_strides(b_shape[:-2], batch)]
    out_shape = [*batch, m, n]
    if a.ndim == 1:
        del out_shape[-2]
    if b.ndim == 1:
        del out_shape[-1]
    iargs = [code, len(batch), *batch, *a_bs, *b_bs, m, k, n]
    y = _output(driver, out, out_shape, a.dtype)
    return _launch("MatMul", "MatMul", y, [a, b], iargs)


def xpu_gemm(
    a: XpuTensor,
    b: XpuTensor,
    c: XpuTensor | None = None,
    *,
    transA: int = 0,  # ONNX attribute names
    transB: int = 0,
    alpha: float = 1.0,
    beta: float = 1.0,
) -> XpuTensor:
    """ONNX Gemm: ``alpha * A' @ B' + beta * C``, C broadcast to (M, N)."""
    driver = _same_driver("Gemm", [t for t in (a, b, c) if t is not None])
    for t in (a, b, c):
        if t is not None:
            _dtype_code("Gemm", t.dtype, allow_int64=False)
    if a.ndim != 2 or b.ndim != 2:
        raise KernelError(f"Gemm: A and B must be 2-D, got {a.shape} and {b.shape}")
    m, k = (a.shape[1], a.shape[0]) if transA else a.shape
    k2, n = (b.shape[1], b.shape[0]) if transB else b.shape
    if k != k2:
        raise KernelError(
            f"Gemm: inner dimensions differ: A' is {m}x{k}, B' is {k2}x{n} "
            f"(transA={transA}, transB={transB})"
        )
    c_strides = [0, 0]
    if c is not None:
        if c.ndim > 2 or _broadcast("Gemm", c.shape, (m, n)) != (m, n):
            raise KernelError(f"Gemm: C of shape {c.shape} does not broadcast to ({m}, {n})")
        c_strides = _broadcast_strides(c.shape, (m, n))
    iargs = [1, m, n, k, int(bool(transA)), int(bool(transB)), *c_strides]
    out = driver.empty((m, n), np.float32)
    return _launch("Gemm", "Gemm", out, [a, b, c], iargs, [float(alpha), float(beta)])


# ---- softmax and reductions ------------------------------------------------------------------


def xpu_softmax(
    x: XpuTensor,
    axis: int = -1,
    *,
    log: bool = False,
    coerce_2d: bool = False,
    out: XpuTensor | None = None,
) -> XpuTensor:
    """Softmax (or LogSoftmax with ``log=True``) along ``axis``, numerically stable.

    Args:
        x: a float32 tensor.
        axis: the axis to normalise over.
        log: compute LogSoftmax.
        coerce_2d: opsets before 13 flatten to 2-D at ``axis`` and normalise each row over
            all of ``shape[axis:]``; set this for those opsets.
    """
    op = "LogSoftmax" if log else "Softmax"
    code = _dtype_code(op, x.dtype, allow_int64=False)
    if x.ndim == 0:
        raise KernelError(f"{op}: the input must have rank >= 1, got a scalar")
    ax = _norm_axis(op, axis, x.ndim)
    outer = _numel(x.shape[:ax])
    if coerce_2d:
        length, inner = _numel(x.shape[ax:]), 1
    else:
        length, inner = x.shape[ax], _numel(x.shape[ax + 1 :])
    y = _output(x.driver, out, x.shape, x.dtype)
    return _launch(op, op, y, [x], [code, outer, length, inner])


def xpu_layer_norm(
    x: XpuTensor,
    scale: XpuTensor,
    bias: XpuTensor | None,
    axis: int,
    epsilon: float,
    out: XpuTensor | None = None,
) -> XpuTensor:
    """ONNX LayerNormalization's ``Y``: each row of ``x.shape[axis:]`` normalised to mean 0
    and variance 1, times ``scale`` plus ``bias`` (broadcast to ``x.shape[axis:]`` on the
    device when they are smaller)."""
    op = "LayerNormalization"
    code = _dtype_code(op, x.dtype, allow_int64=False)
    if x.ndim == 0:
        raise KernelError(f"{op}: the input must have rank >= 1, got a scalar")
    ax = _norm_axis(op, axis, x.ndim)
    norm = tuple(x.shape[ax:])
    temps = []
    params = []
    for name, t in (("Scale", scale), ("B", bias)):
        if t is not None and tuple(t.shape) != norm:
            if len(t.shape) > len(norm) or _broadcast(op, t.shape, norm) != norm:
                raise KernelError(
                    f"{op}: {name} of shape {tuple(t.shape)} does not broadcast to the "
                    f"normalized shape {norm}"
                )
            t = xpu_expand(t, norm)
            temps.append(t)
        params.append(t)
    try:
        y = _output(x.driver, out, x.shape, x.dtype)
        iargs = [code, _numel(x.shape[:ax]), _numel(norm)]
        return _launch(op, op, y, [x, *params], iargs, [float(epsilon)])
    finally:
        for t in temps:
            t.free()  # drains the queue first, so the launch has read it


def xpu_reduce(
    op: str,
    x: XpuTensor,
    axes: Sequence[int] | None = None,
    keepdims: bool = True,
    *,
    noop_with_empty_axes: bool = False,
) -> XpuTensor:
    """An op in :data:`REDUCE_OPS` over ``axes`` (None or empty: all axes, ONNX's default).

    With ``noop_with_empty_axes`` and no axes the input is copied unchanged, as ONNX says.
    """
    if op not in REDUCE_OPS:
        raise KernelError(f"the XPU has no reduction {op!r}; it has {sorted(REDUCE_OPS)}")
    code = _dtype_code(op, x.dtype, allow_int64=op != "ReduceMean")
    if not axes:
        if noop_with_empty_axes:
            return xpu_copy(x)
        axes = range(x.ndim)
    norm = sorted({_norm_axis(op, int(a), x.ndim) for a in axes})
    if len(norm) != len(list(axes)):
        raise KernelError(f"{op}: axes {list(axes)} repeat an axis")
    mask = [1 if d in norm else 0 for d in range(x.ndim)]
    if keepdims:
        out_shape = tuple(1 if m else s for s, m in zip(x.shape, mask))
    else:
        out_shape = tuple(s for s, m in zip(x.shape, mask) if not m)
    out = x.driver.empty(out_shape, x.dtype)
    return _launch(op, op, out, [x], [code, x.ndim, *x.shape, *mask])


# ---- data movement ---------------------------------------------------------------------------


def _copy_args(
    elsize: int,
    shape: Sequence[int],
    src_strides: Sequence[int],
    src_offset: int,
    dst_strides: Sequence[int],
    dst_offset: int,
) -> list[int]:
    """The iargs of the C ``Copy`` kernel (see driver/kernels_copy.c)."""
    return [elsize, len(shape), *shape, *src_strides, src_offset, *dst_strides, dst_offset]


def xpu_copy(x: XpuTensor) -> XpuTensor:
    """A fresh device copy of ``x`` (device-to-device memcpy)."""
    out = x.driver.empty(x.shape, x.dtype)
    try:
        x.driver.copy_dtod(out.handle, x.handle, x.nbytes)
    except BaseException:
        out.free()
        raise
    return out


def xpu_transpose(
    x: XpuTensor, perm: Sequence[int] | None = None, out: XpuTensor | None = None
) -> XpuTensor:
    """Permutes the axes (default: reversed), as ONNX Transpose."""
    es = _elsize("Transpose", x.dtype)
    perm = list(range(x.ndim))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(x.ndim)):
        raise KernelError(f"Transpose: perm {perm} is not a permutation of 0..{x.ndim - 1}")
    src = _strides(x.shape)
    shape = [x.shape[p] for p in perm]
    iargs = _copy_args(es, shape, [src[p] for p in perm], 0, _strides(shape), 0)
    return _launch("Transpose", "Copy", _output(x.driver, out, shape, x.dtype), [x], iargs)


def xpu_concat(xs: Sequence[XpuTensor], axis: int) -> XpuTensor:
    """Joins tensors along ``axis``: one strided copy per input into its window."""
    if not xs:
        raise KernelError("Concat: needs at least one input")
    driver = _same_driver("Concat", xs)
    first = xs[0]
    es = _elsize("Concat", first.dtype)
    ax = _norm_axis("Concat", axis, first.ndim)
    for t in xs[1:]:
        if (
            t.dtype != first.dtype
            or t.ndim != first.ndim
            or any(s != f for d, (s, f) in enumerate(zip(t.shape, first.shape)) if d != ax)
        ):
            raise KernelError(
                f"Concat along axis {axis}: input {t.shape} {t.dtype} does not match "
                f"{first.shape} {first.dtype} outside the concat axis"
            )
    shape = list(first.shape)
    shape[ax] = sum(t.shape[ax] for t in xs)
    out = driver.empty(shape, first.dtype)
    dst = _strides(shape)
    start = 0
    for t in xs:
        if t.size:
            iargs = _copy_args(es, t.shape, _strides(t.shape), 0, dst, start * dst[ax])
            _launch("Concat", "Copy", out, [t], iargs)
        start += t.shape[ax]
    return out


def _slice_window(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX Slice's clamping for one axis: the first index and the element count."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start = min(max(start, 0), dim)
        end = min(max(end, 0), dim)
        count = max(0, (end - start + step - 1) // step)
    else:
        start = min(max(start, 0), dim - 1)
        end = min(max(end, -1), dim - 1)
        count = max(0, (start - end + (-step) - 1) // (-step))
    return start, count


def xpu_slice(
    x: XpuTensor,
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
) -> XpuTensor:
    """ONNX Slice: raw starts/ends (negative, INT_MAX/INT_MIN allowed), optional axes/steps."""
    es = _elsize("Slice", x.dtype)
    starts = [int(s) for s in starts]
    ends = [int(e) for e in ends]
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise KernelError(
            f"Slice: starts, ends, axes and steps have different lengths "
            f"({len(starts)}, {len(ends)}, {len(axes)}, {len(steps)})"
        )
    src = _strides(x.shape)
    shape = list(x.shape)
    step_of = [1] * x.ndim
    offset = 0
    seen: set[int] = set()
    for s, e, a, st in zip(starts, ends, axes, steps):
        ax = _norm_axis("Slice", a, x.ndim)
        if ax in seen:
            raise KernelError(f"Slice: axis {a} appears twice in axes {axes}")
        seen.add(ax)
        if st == 0:
            raise KernelError(f"Slice: step 0 on axis {a}; steps must be non-zero")
        first, count = _slice_window(x.shape[ax], s, e, st)
        shape[ax] = count
        step_of[ax] = st
        if count:
            offset += first * src[ax]
    strides = [src[d] * step_of[d] for d in range(x.ndim)]
    if _numel(shape) == 0:
        offset = 0
    iargs = _copy_args(es, shape, strides, offset, _strides(shape), 0)
    return _launch("Slice", "Copy", x.driver.empty(shape, x.dtype), [x], iargs)


def xpu_expand(x: XpuTensor, shape: Sequence[int]) -> XpuTensor:
    """ONNX Expand: broadcast ``x`` against ``shape`` (the result may be larger than both)."""
    es = _elsize("Expand", x.dtype)
    out_shape = _broadcast("Expand", x.shape, [int(d) for d in shape])
    src = _broadcast_strides(x.shape, out_shape)
    iargs = _copy_args(es, out_shape, src, 0, _strides(out_shape), 0)
    return _launch("Expand", "Copy", x.driver.empty(out_shape, x.dtype), [x], iargs)


def xpu_reshape(
    x: XpuTensor, shape: Sequence[int], *, allowzero: bool = False, copy: bool = True
) -> XpuTensor:
    """ONNX Reshape (0 copies the input's dimension unless ``allowzero``; one -1 is inferred).

    Args:
        x: the input.
        shape: the target shape.
        allowzero: ONNX's attribute: a 0 in ``shape`` is a real zero-length dimension.
        copy: True returns a new buffer (device-to-device copy); False returns a view that
            shares ``x``'s handle (``is_view=True``) and must not outlive or free ``x``.
    """
    dims = [int(d) for d in shape]
    if not allowzero:
        for d, v in enumerate(dims):
            if v == 0:
                if d >= x.ndim:
                    raise KernelError(f"Reshape: 0 at position {d} has no input dimension to copy")
                dims[d] = x.shape[d]
    if dims.count(-1) > 1 or any(v < -1 for v in dims):
        raise KernelError(f"Reshape: shape {list(shape)} has more than one -1 or a negative size")
    if -1 in dims:
        known = _numel([v for v in dims if v != -1])
        if known == 0 or x.size % known:
            raise KernelError(f"Reshape: cannot infer -1 reshaping {x.shape} to {list(shape)}")
        dims[dims.index(-1)] = x.size // known
    if _numel(dims) != x.size:
        raise KernelError(
            f"Reshape: {x.shape} has {x.size} elements, shape {list(shape)} -> {dims} has "
            f"{_numel(dims)}"
        )
    if not copy:
        return XpuTensor(x.handle, dims, x.dtype, x.nbytes, x.driver, is_view=True)
    result = xpu_copy(x)
    result.shape = tuple(dims)
    return result
