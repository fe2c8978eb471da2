"""A 1x1 convolution between plain (NCHW) neighbours as oneDNN's matmul primitive.

With stride 1 and no padding, ``Y[n, g] = W[g] @ X[n, g]`` for each of the G groups (``W[g]``
is ``[M/G, C/G]``, ``X[n, g]`` is ``[C/G, H*W]``), plus bias per row, Z, activation: the weights
are the matmul's source (broadcast over the batch), the activations its ``weights`` argument,
every tensor in its own NCHW memory, so nothing is reordered. Z is a ``sum`` post-op; the
bias a ``binary_add`` post-op of a ``[1, M, 1]`` tensor (as the matmul's bias argument, that
shape sends oneDNN to its reference kernel, 500x slower), then the activation an ``eltwise``.
With groups (4-D) the bias post-op also takes the reference kernel, so the bias, and a Relu
after it, are added after, in one pass of generated C (``FusedElementwise``'s kernel); other
activations after a bias decline.

Measured at one thread (medians, the ``x64:gemm:jit`` convolution on NCHW against this
``brg:avx512_core`` matmul, us): 58->58 channels at 28x28 106 / 64, 24->58 at 56x56 1116 / 104,
64->256 at 56x56 5627 / 941, 256->64 at 56x56 2108 / 947, 1024->256 at 14x14 1039 / 1049;
ShuffleNet v1's four groups (CPU time): 24->112 at 56x56 2245 / 385, 136->136 at 28x28
737 / 150, 136->544 at 7x7 72 / 62. ShuffleNet's, SqueezeNet's and DenseNet's 1x1
convolutions write NCHW buffers for the Concat, Split and Reshape nodes that read them, so
this is their path.

Returns None (the convolution primitive runs instead) for strides or pads other than the
identity's, and anything oneDNN declines or runs with its reference kernel.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.kernels.op_fused_elementwise import fused_elementwise
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C, omp_threads

__all__ = ["run"]


def run(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    z: np.ndarray | None,
    act: tuple[int, float, float] | None,
    y_shape: tuple[int, ...],
    window: tuple,
    out: np.ndarray | None,
) -> np.ndarray | None:
    """``act(conv1x1(x, w) + b + z)`` for a C-contiguous or channels-last ``x`` (read in
    place: a strided operand costs brgemm 5-15 us where a reorder into NCHW costs 40-65 at
    ShuffleNet's 136x28x28), into ``out`` when it fits; None where this path does not
    apply."""
    strides, _, begin, end = window
    if any(s != 1 for s in strides) or any(begin) or any(end):
        return None
    n, c = x.shape[:2]
    m, cols, g = w.shape[0], math.prod(x.shape[2:]), c // w.shape[1]
    # oneDNN's matmul broadcasts a bias post-op per row only in 3-D (grouped: 4-D, where it
    # takes the reference kernel): with groups the bias, and the Relu after it, run in numpy.
    outside = b is not None and g > 1
    if outside and act is not None and act != (C.eltwise_relu, 0.0, 0.0):
        return None
    inner_act, inner_b = (None, None) if outside else (act, b)
    nhwc = not x.flags.c_contiguous  # the caller passes C-contiguous or channels-last
    key = ("conv1x1", n, c, m, cols, inner_b is not None, z is not None, inner_act, g, nhwc)
    key += (omp_threads(),)
    try:
        prim = P.cached(
            key,
            lambda: _build(n, c, m, cols, g, inner_b is not None, z is not None, inner_act, nhwc),
        )
    except P.Unsupported:
        return None
    y = out if fits(out, y_shape, np.dtype(np.float32)) else np.empty(y_shape, np.float32)
    if z is not None:
        np.copyto(y, z)
    bufs = {C.arg_src: np.ascontiguousarray(w), C.arg_weights: x, C.arg_dst: y}
    if inner_b is not None:
        bufs[C.arg_post_op_src1(int(z is not None))] = np.ascontiguousarray(inner_b)
    prim.run(bufs)
    if outside:
        # one pass of generated C, in place (numpy's add then maximum: the same values, 101
        # against 29 us at ShuffleNet's 136x28x28)
        rows = y.reshape(n, m, cols)
        expr = "add(in0,in1)" if act is None else "max(add(in0,in1),0.0)"
        fused_elementwise(rows, b.reshape(m, 1), expr=expr, out=rows)
    return y


def _build(
    n: int,
    c: int,
    m: int,
    cols: int,
    g: int,
    bias: bool,
    sum_z: bool,
    act: tuple | None,
    nhwc: bool = False,
) -> P.Prim:
    L = P.lib()
    if g == 1:
        src, wei, dst = P.md((1, m, c), C.abc), P.md((n, c, cols), C.abc), P.md((n, m, cols), C.abc)
        if nhwc:  # X[n] is [C, H*W] with strides (1, C): brgemm reads it transposed
            wei = P.md_strided((n, c, cols), (c * cols, 1, c))
    else:
        src = P.md((1, g, m // g, c // g), C.abcd)
        wei = P.md((n, g, c // g, cols), C.abcd)
        if nhwc:
            wei = P.md_strided((n, g, c // g, cols), (c * cols, c // g, 1, c))
        dst = P.md((n, g, m // g, cols), C.abcd)
    bias_md: Any = P.md((1, m, 1), C.abc) if bias else None
    attr = P.post_ops(sum_z, act, bias_md)
    pd = P.make_pd(
        L.dnnl.dnnl_matmul_primitive_desc_create, L.engine, src, wei, L.ffi.NULL, dst, attr
    )
    if not P.impl_info(pd).startswith("brg"):
        raise P.Unsupported("oneDNN's reference matmul: the convolution primitive is faster")
    args = {C.arg_src: src, C.arg_weights: wei, C.arg_dst: dst}
    if bias:
        args[C.arg_post_op_src1(int(sum_z))] = bias_md
    return P.Prim(pd, args)
