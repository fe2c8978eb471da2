"""MaxPool (with Indices) and AveragePool over 1-, 2- and 3-D windows.

Every input is treated as 3-D (leading spatial sizes of 1); one work-item per output element
walks its window with pads, strides, dilations and ceil_mode from
``ir.window.window_geometry`` (the CPU backend's too). AveragePool divides by the window
positions inside the padded input (``count_include_pad=1``) or inside the input; MaxPool's
Indices are flat offsets into the input in row-major order (``storage_order=1``: column-major
over the spatial axes, 2-D).
"""

from __future__ import annotations

import numpy as np

from anychip.backends.opencl.driver import ClTensor
from anychip.backends.opencl.kernels._common import ctype, dev, launch1d
from anychip.backends.opencl.kernels.table import F, kernel
from anychip.errors import KernelError
from anychip.ir.window import window_geometry

__all__ = ["pool"]


def _source() -> str:
    return r"""
__kernel void k_pool(__global const T* x, __global T* y, __global long* idx,
                     __global const int* m, int mode, int want_idx, int n) {
    /* m = [in(3), out(3), k(3), stride(3), dil(3), pad_begin(3), pad_end(3), count_pad,
            storage_order]; mode 0: max, 1: average */
    int i = get_global_id(0); if (i >= n) return;
    int ow = i % m[5]; int t = i / m[5]; int oh = t % m[4]; t /= m[4]; int od = t % m[3];
    int nc = t / m[3];
    int D = m[0], H = m[1], W = m[2];
    __global const T* xb = x + (long)nc * D * H * W;
    T acc = mode == 0 ? -INFINITY : (T)0; int cnt = 0; long best = -1;
    for (int a = 0; a < m[6]; ++a) {
        int z = od * m[9] - m[15] + a * m[12];
        for (int b = 0; b < m[7]; ++b) {
            int h = oh * m[10] - m[16] + b * m[13];
            for (int c = 0; c < m[8]; ++c) {
                int w = ow * m[11] - m[17] + c * m[14];
                bool inside = z >= 0 && z < D && h >= 0 && h < H && w >= 0 && w < W;
                if (mode == 1 && m[21]) {
                    if (z < D + m[18] && h < H + m[19] && w < W + m[20]) cnt++;
                } else if (inside) cnt++;
                if (!inside) continue;
                T v = xb[((long)z * H + h) * W + w];
                if (mode == 0) {
                    if (v > acc || best < 0) {
                        acc = v;
                        best = m[22] ? ((long)w * H + h) : (((long)z * H + h) * W + w);
                    }
                } else acc += v;
            }
        }
    }
    y[i] = mode == 0 ? acc : acc / (T)max(cnt, 1);
    if (want_idx) idx[i] = best + (long)nc * D * H * W;
}
"""


def pool(
    x: ClTensor,
    op: str,
    *,
    kernel_shape: list[int],
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    count_include_pad: int = 0,
    storage_order: int = 0,
    indices: bool = False,
) -> tuple[ClTensor, ClTensor | None]:
    """MaxPool or AveragePool of ``x``; the Indices tensor too when ``indices``."""
    d = dev(x)
    ct = ctype(x.dtype, op)
    nsp = x.ndim - 2
    if not 1 <= nsp <= 3:
        raise KernelError(f"{op} on OpenCL takes 1-D to 3-D windows, got X {list(x.shape)}")
    g = window_geometry(
        x.shape[2:], list(kernel_shape), strides=strides, dilations=dilations, pads=pads,
        auto_pad=auto_pad, ceil_mode=ceil_mode, op=op,
    )  # fmt: skip

    def three(v: list[int], fill: int) -> list[int]:
        return [fill] * (3 - nsp) + list(v)

    meta = (
        three(list(x.shape[2:]), 1) + three(g.out, 1) + three(g.kernel, 1)
        + three(g.strides, 1) + three(g.dilations, 1) + three(g.begin, 0)
        + three(g.end, 0) + [int(count_include_pad), int(storage_order)]
    )  # fmt: skip
    y = d.empty((*x.shape[:2], *g.out), x.dtype)
    idx = d.empty(y.shape, np.int64) if indices else None
    args = [x.buffer, y.buffer, (idx if idx is not None else y).buffer, d.meta(tuple(meta))]
    args += [np.int32(op == "AveragePool"), np.int32(indices)]
    launch1d(d, "pool", ct, "k_pool", _source, y.size, args)
    return y, idx


@kernel("MaxPool", since=8, dtypes=F, context=True)
def max_pool(ctx, x, **attrs):
    want = ctx.num_outputs > 1 and ctx.outputs_used[1]
    y, idx = pool(x, "MaxPool", indices=want, **attrs)
    return (y, idx) if want else y


@kernel("AveragePool", since=7, dtypes=F)
def average_pool(x, **attrs):
    y, _ = pool(x, "AveragePool", **attrs)
    return y
