"""Softmax/LogSoftmax, LayerNormalization and BatchNormalization (inference).

Softmax views its input as ``(outer, n, inner)`` around the normalised axis (Softmax-1/11
flatten at ``axis`` first: ``inner`` = 1 and ``n`` the product of the trailing axes); one
work-item per ``(outer, inner)`` pair takes the maximum, the sum of exponentials, and writes.
LayerNormalization is one work-item per row of ``prod(shape[axis:])`` elements (mean, then
variance of the centred values: two passes, as the CPU's). BatchNormalization is
element-wise with per-channel statistics.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.opencl.driver import ClTensor
from anychip.backends.opencl.kernels._common import (
    contiguous_strides,
    ctype,
    dev,
    launch1d,
    norm_axis,
)
from anychip.backends.opencl.kernels.op_data import strided_copy
from anychip.backends.opencl.kernels.table import F, kernel
from anychip.errors import KernelError

__all__ = ["softmax"]


def _source() -> str:
    return r"""
__kernel void k_softmax(__global const T* x, __global T* y, int len, int inner, int logm,
                        int n) {
    int i = get_global_id(0); if (i >= n) return;
    int o = i / inner, in_ = i % inner;
    __global const T* xr = x + (long)o * len * inner + in_;
    __global T* yr = y + (long)o * len * inner + in_;
    T mx = -INFINITY;
    for (int j = 0; j < len; ++j) mx = fmax(mx, xr[j * inner]);
    T s = (T)0;
    for (int j = 0; j < len; ++j) s += exp(xr[j * inner] - mx);
    T ls = log(s), r = (T)1 / s;
    for (int j = 0; j < len; ++j) {
        T z = xr[j * inner] - mx;
        yr[j * inner] = logm ? z - ls : exp(z) * r;
    }
}
__kernel void k_layernorm(__global const T* x, __global const T* g, __global const T* b,
                          __global T* y, __global float* mean, __global float* inv,
                          int cols, float eps, int has_b, int n) {
    int i = get_global_id(0); if (i >= n) return;
    __global const T* xr = x + (long)i * cols; __global T* yr = y + (long)i * cols;
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += (float)xr[j];
    float mu = s / (float)cols;
    float v = 0.0f;
    for (int j = 0; j < cols; ++j) { float c = (float)xr[j] - mu; v += c * c; }
    float r = 1.0f / sqrt(v / (float)cols + eps);
    for (int j = 0; j < cols; ++j) {
        float z = ((float)xr[j] - mu) * r * (float)g[j];
        if (has_b) z += (float)b[j];
        yr[j] = (T)z;
    }
    mean[i] = mu; inv[i] = r;
}
__kernel void k_batchnorm(__global const T* x, __global const T* sc, __global const T* bi,
                          __global const T* mu, __global const T* var, __global T* y,
                          int C, int inner, float eps, int n) {
    int i = get_global_id(0); if (i >= n) return;
    int c = (i / inner) % C;
    T r = (T)1 / sqrt(var[c] + (T)eps);
    y[i] = (x[i] - mu[c]) * r * sc[c] + bi[c];
}
"""


def softmax(x: ClTensor, axis: int, *, log: bool = False, flatten: bool = False) -> ClTensor:
    """Softmax (or LogSoftmax) of ``x`` along ``axis``; ``flatten``: the opset < 13 form."""
    op = "LogSoftmax" if log else "Softmax"
    d = dev(x)
    ct = ctype(x.dtype, op)
    a = norm_axis(axis, x.ndim, op)
    outer = int(np.prod(x.shape[:a], dtype=np.int64))
    if flatten:
        length, inner = int(np.prod(x.shape[a:], dtype=np.int64)), 1
    else:
        length, inner = x.shape[a], int(np.prod(x.shape[a + 1 :], dtype=np.int64))
    y = d.empty(x.shape, x.dtype)
    args = [x.buffer, y.buffer, np.int32(length), np.int32(inner), np.int32(log)]
    if length:
        launch1d(d, "norm", ct, "k_softmax", _source, outer * inner, args)
    return y


@kernel("Softmax", since=1, until=12, dtypes=F)
def softmax_v1(x: ClTensor, *, axis: int = 1) -> ClTensor:
    return softmax(x, axis, flatten=True)


@kernel("Softmax", since=13, dtypes=F)
def softmax_v13(x: ClTensor, *, axis: int = -1) -> ClTensor:
    return softmax(x, axis)


@kernel("LogSoftmax", since=1, until=12, dtypes=F)
def log_softmax_v1(x: ClTensor, *, axis: int = 1) -> ClTensor:
    return softmax(x, axis, log=True, flatten=True)


@kernel("LogSoftmax", since=13, dtypes=F)
def log_softmax_v13(x: ClTensor, *, axis: int = -1) -> ClTensor:
    return softmax(x, axis, log=True)


def _full(t: ClTensor | None, shape: tuple[int, ...]) -> tuple[ClTensor | None, bool]:
    """``t`` broadcast to ``shape`` as a dense tensor; (tensor, whether it is a new one)."""
    if t is None or t.shape == shape:
        return t, False
    st = contiguous_strides(t.shape)
    lead = len(shape) - t.ndim
    sstr = [0] * lead + [0 if s == 1 else v for s, v in zip(t.shape, st)]
    out = dev(t).empty(shape, t.dtype)
    strided_copy(t, out, shape, sstr, contiguous_strides(shape))
    return out, True


@kernel("LayerNormalization", since=17, dtypes=F)
def layer_normalization(
    x: ClTensor,
    scale: ClTensor,
    b: ClTensor | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> tuple[ClTensor, ClTensor, ClTensor]:
    if stash_type != 1:
        raise KernelError(f"LayerNormalization: stash_type {stash_type} (OpenCL keeps float32)")
    d = dev(x, scale, b)
    ct = ctype(x.dtype, "LayerNormalization")
    a = norm_axis(axis, x.ndim, "LayerNormalization")
    rows = int(np.prod(x.shape[:a], dtype=np.int64))
    cols = int(np.prod(x.shape[a:], dtype=np.int64))
    g, own_g = _full(scale, x.shape[a:])
    bb, own_b = _full(b, x.shape[a:])
    stat_shape = (*x.shape[:a], *([1] * (x.ndim - a)))
    y = d.empty(x.shape, x.dtype)
    mean = d.empty(stat_shape, np.float32)
    inv = d.empty(stat_shape, np.float32)
    args = [x.buffer, g.buffer, (bb or g).buffer, y.buffer, mean.buffer, inv.buffer]
    args += [np.int32(cols), np.float32(epsilon), np.int32(bb is not None)]
    try:
        if cols:
            launch1d(d, "norm", ct, "k_layernorm", _source, rows, args)
    finally:
        for t, own in ((g, own_g), (bb, own_b)):
            if own:
                t.release()
    return y, mean, inv


@kernel("BatchNormalization", since=9, until=13, dtypes=F)
def batch_normalization(
    x: ClTensor,
    scale: ClTensor,
    b: ClTensor,
    mean: ClTensor,
    var: ClTensor,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
) -> ClTensor:
    d = dev(x, scale, b, mean, var)
    ct = ctype(x.dtype, "BatchNormalization")
    if x.ndim < 2:
        raise KernelError(f"BatchNormalization: input of rank {x.ndim} (needs N, C, ...)")
    c = x.shape[1]
    for name, t in (("scale", scale), ("B", b), ("mean", mean), ("var", var)):
        if t.size != c:
            raise KernelError(f"BatchNormalization: {name} has {t.size} values, not C={c}")
    inner = int(np.prod(x.shape[2:], dtype=np.int64))
    y = d.empty(x.shape, x.dtype)
    args = [x.buffer, scale.buffer, b.buffer, mean.buffer, var.buffer, y.buffer]
    args += [np.int32(c), np.int32(inner), np.float32(epsilon)]
    launch1d(d, "norm", ct, "k_batchnorm", _source, x.size, args)
    return y
