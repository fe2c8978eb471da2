"""``com.microsoft`` quantized ops: the QOperator ops of onnxruntime's static quantizer.

Each is "dequantize the inputs, run the float op, quantize the result" (round half to even,
saturate), which is how onnxruntime's specs define them; onnxruntime's integer kernels may
land one quantization step apart on a few elements (they round intermediate sums in other
ways), so tests compare within one step. Unary ops on 8-bit inputs go through a 256-entry
lookup table as onnxruntime's do. QuantizeLinear/DequantizeLinear here are the ONNX ops with
16-bit and 4-bit types, as onnxruntime offered them before ONNX opset 21.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._qproduct import product_of, run_product
from anychip.backends.cpu.kernels.op_pool import average_pool
from anychip.backends.cpu.kernels.op_quantize import dequantize_linear, quantize_linear
from anychip.backends.cpu.kernels.op_softmax import softmax, softmax_2d
from anychip.backends.cpu.native import qlinear
from anychip.backends.cpu.onednn.int8 import int_matmul
from anychip.backends.cpu.replay import record as _replay
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = [
    "ms_quantize_linear",
    "ms_dequantize_linear",
    "qlinear_add",
    "qlinear_mul",
    "qlinear_sigmoid",
    "qlinear_leaky_relu",
    "qlinear_softmax",
    "qlinear_average_pool",
    "qlinear_global_average_pool",
    "qlinear_concat",
    "qgemm",
]


def _zero(zp: np.ndarray | None, like: np.ndarray) -> np.ndarray:
    return np.zeros((), like.dtype) if zp is None else zp


def _deq(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    return (x.astype(np.float32) - _zero(zp, x).astype(np.float32)) * scale.astype(np.float32)


def _q(v: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, like: np.ndarray) -> np.ndarray:
    """Quantize to ``zp``'s type (``like``'s when there is no zero point)."""
    z = _zero(zp, like)
    info = np.iinfo(z.dtype)
    q = np.rint(v / scale.astype(np.float32)) + z.astype(np.float32)
    return np.clip(q, info.min, info.max).astype(z.dtype)


@kernel("QuantizeLinear", domain=MS_DOMAIN, since=1)
def ms_quantize_linear(
    x: np.ndarray, y_scale: np.ndarray, y_zero_point: np.ndarray | None = None, *, axis: int = 1
) -> np.ndarray:
    return quantize_linear(x, y_scale, y_zero_point, axis=axis)


@kernel("DequantizeLinear", domain=MS_DOMAIN, since=1)
def ms_dequantize_linear(
    x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None = None, *, axis: int = 1
) -> np.ndarray:
    return dequantize_linear(x, x_scale, x_zero_point, axis=axis)


def _binary(fn, a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp) -> np.ndarray:
    op = int(fn is np.multiply)
    y = qlinear.qbinary(op, a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp, seal=True)
    if y is not None:  # per tensor, in C: the same float32 operations as below
        return y
    return _q(fn(_deq(a, a_s, a_zp), _deq(b, b_s, b_zp)), c_s, c_zp, a)


@kernel("QLinearAdd", domain=MS_DOMAIN, since=1)
def qlinear_add(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray | None,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None,
    c_scale: np.ndarray,
    c_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    return _binary(
        np.add, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point
    )


@kernel("QLinearMul", domain=MS_DOMAIN, since=1)
def qlinear_mul(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray | None,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None,
    c_scale: np.ndarray,
    c_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    return _binary(
        np.multiply, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point
    )


#: 256-entry tables of ``_unary`` by op and quantization parameters (a model has a few).
_TABLES: dict[tuple, np.ndarray] = {}


def _param_key(p: np.ndarray | None) -> tuple | None:
    return None if p is None else (p.dtype.str, p.shape, p.tobytes())


def _constants(ctx: Any, indices: range) -> bool:
    """Whether the node's inputs at ``indices`` are constants of the graph (or absent)."""
    inputs = getattr(getattr(ctx, "node", None), "inputs", None)
    if inputs is None:
        return False
    return all(
        i >= len(inputs) or inputs[i] is None or inputs[i].const is not None for i in indices
    )


def _unary(fn, x, x_s, x_zp, y_s, y_zp, op: tuple = (), constant: bool = False) -> np.ndarray:
    """``fn`` on dequantized values, through a lookup table for 8-bit inputs, kept per
    ``op`` (its name and attributes) and parameters when ``op`` is given; the table's C call
    seals the node for a replay only where the parameters are ``constant`` (a replay reuses
    the table)."""
    if x.dtype.itemsize == 1:
        info = np.iinfo(x.dtype)
        key = (op, x.dtype.str, *map(_param_key, (x_s, x_zp, y_s, y_zp))) if op else None
        table = _TABLES.get(key) if key else None
        if table is None:
            codes = np.arange(info.min, info.max + 1).astype(x.dtype)
            table = _q(fn(_deq(codes, x_s, x_zp)), y_s, y_zp, x)
            if key:
                if len(_TABLES) > 256:
                    _TABLES.clear()
                _TABLES[key] = table
        y = qlinear.lookup(x, np.ascontiguousarray(table), seal=constant)  # C
        return y if y is not None else table[x.astype(np.int64) - info.min]
    return _q(fn(_deq(x, x_s, x_zp)), y_s, y_zp, x)


@kernel("QLinearSigmoid", domain=MS_DOMAIN, since=1, context=True)
def qlinear_sigmoid(
    ctx: Any,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    fn = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    const = _constants(ctx, range(1, 5))
    return _unary(fn, x, x_scale, x_zero_point, y_scale, y_zero_point, ("sigmoid",), const)


@kernel("QLinearLeakyRelu", domain=MS_DOMAIN, since=1, context=True)
def qlinear_leaky_relu(
    ctx: Any,
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    alpha: float = 0.01,
) -> np.ndarray:
    fn = lambda v: np.where(v >= 0, v, v * np.float32(alpha))  # noqa: E731
    const = _constants(ctx, range(1, 5))
    key = ("leaky", float(alpha))
    return _unary(fn, x, x_scale, x_zero_point, y_scale, y_zero_point, key, const)


@kernel("QLinearSoftmax", domain=MS_DOMAIN, since=1)
def qlinear_softmax(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    axis: int = -1,
    opset: int = 13,
) -> np.ndarray:
    """Softmax of the dequantized input; before opset 13 over the flattened axes from
    ``axis`` on (the old Softmax's 2-D semantics)."""
    v = _deq(x, x_scale, x_zero_point)
    p = softmax_2d(v, axis=axis) if opset < 13 else softmax(v, axis=axis)
    _replay.unseal()  # softmax sealed its call; the quantization here is not noted
    return _q(p, y_scale, y_zero_point, x)


def _channels_first(x: np.ndarray, channels_last: int) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if channels_last else x


@kernel("QLinearAveragePool", domain=MS_DOMAIN, since=1)
def qlinear_average_pool(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    channels_last: int = 0,
    count_include_pad: int = 0,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    v = _channels_first(_deq(x, x_scale, x_zero_point), channels_last)
    y = average_pool(
        v,
        auto_pad=auto_pad,
        ceil_mode=ceil_mode,
        count_include_pad=count_include_pad,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    _replay.unseal()  # the pool may have sealed its call; the rest here is not noted
    y = np.moveaxis(y, 1, -1) if channels_last else y
    return _q(y, y_scale, y_zero_point, x)


@kernel("QLinearGlobalAveragePool", domain=MS_DOMAIN, since=1)
def qlinear_global_average_pool(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    *,
    channels_last: int = 0,
) -> np.ndarray:
    v = _deq(x, x_scale, x_zero_point)
    axes = tuple(range(1, v.ndim - 1)) if channels_last else tuple(range(2, v.ndim))
    return _q(v.mean(axis=axes, keepdims=True), y_scale, y_zero_point, x)


@kernel("QLinearConcat", domain=MS_DOMAIN, since=1)
def qlinear_concat(
    y_scale: np.ndarray, y_zero_point: np.ndarray, *inputs: np.ndarray, axis: int
) -> np.ndarray:
    """Inputs come in (tensor, scale, zero point) triples."""
    if len(inputs) % 3:
        raise KernelError(
            f"QLinearConcat: {len(inputs)} inputs after Y_scale and Y_zero_point; they must "
            "come in (tensor, scale, zero point) triples"
        )
    parts = [_deq(*inputs[i : i + 3]) for i in range(0, len(inputs), 3)]
    return _q(np.concatenate(parts, axis=axis), y_scale, y_zero_point, inputs[0])


def _qgemm_product(
    b: np.ndarray, a_scale: np.ndarray, b_scale: np.ndarray, b_zero_point: np.ndarray,
    c: np.ndarray | None, y_scale: np.ndarray | None, y_zero_point: np.ndarray | None,
    alpha: float, trans_b: bool,
) -> qlinear.Product | None:  # fmt: skip
    """QGemm's ``Product``: ``alpha * sa * sb`` in float32 as ``qgemm`` rounds it, ``C`` as
    an int32 bias per column, quantized as ``_q`` does; None for other forms."""
    n = b.shape[0] if trans_b else b.shape[1]
    if c is not None and (c.size != n or c.shape[-1:] != (n,) or c.dtype != np.int32):
        return None  # per column only (a [M, N] or per-row C: the numpy path)
    if np.asarray(a_scale).size != 1 or np.asarray(b_scale).size not in (1, n):
        return None
    scale = np.float32(alpha) * a_scale.astype(np.float32) * b_scale.astype(np.float32)
    bc = qlinear.centered(b, b_zero_point, trans_b)
    if y_scale is None:
        return qlinear.Product(bc, n, 1, scale=scale, c=c)
    if y_zero_point is None:  # quantized to A's type: left to the numpy path
        return None
    z = np.asarray(y_zero_point)
    if np.asarray(y_scale).size != 1 or z.size != 1 or z.dtype.itemsize != 1:
        return None
    ys = float(np.asarray(y_scale).astype(np.float32).reshape(()))
    return qlinear.Product(bc, n, 2, scale=scale, c=c, ys=ys, yzp=z, out_dtype=z.dtype)


@kernel("QGemm", domain=MS_DOMAIN, since=1, context=True)
def qgemm(
    ctx: Any,
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    c: np.ndarray | None = None,
    y_scale: np.ndarray | None = None,
    y_zero_point: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    transA: int = 0,
    transB: int = 0,
) -> np.ndarray:
    """Integer GEMM: ``alpha * a_scale * b_scale * ((A - a_zp) @ (B - b_zp) + C)``; B may be
    quantized per output column. A float result without ``y_scale``, else quantized."""
    if not transA and b.ndim == 2 and b.dtype.itemsize == 1:  # in one C call (_qproduct)
        arrays = (b, a_scale, b_scale, b_zero_point, c, y_scale, y_zero_point)
        prod = product_of(
            ctx, (1, 3, 4, 5, 6, 7, 8), arrays,
            lambda: _qgemm_product(*arrays, alpha, bool(transB)),
        )  # fmt: skip
        zps = (a_zero_point, b, b_zero_point, bool(transB))
        y = None if prod is None else run_product(prod, a, *zps, seal=True)
        if y is not None:
            return y
    acc = None if transA else int_matmul(a, b, a_zero_point, b_zero_point, bool(transB))
    if acc is None:  # oneDNN's int8 product not exact here (onednn/int8.py): int64 numpy
        ai = a.astype(np.int64) - a_zero_point.astype(np.int64)
        bi = b.astype(np.int64)
        bi = (bi.T if transB else bi) - np.asarray(b_zero_point).astype(np.int64).reshape(1, -1)
        acc = (ai.T if transA else ai) @ bi
    if c is not None:
        acc = acc + c.astype(np.int64)
    scale = np.float32(alpha) * a_scale.astype(np.float32) * b_scale.astype(np.float32)
    y = acc.astype(np.float32) * scale.reshape(1, -1)
    if y_scale is None:
        return y
    return _q(y, y_scale, y_zero_point, a)
