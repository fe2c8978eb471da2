"""Conv (1-D and 2-D, groups, dilations, pads, auto_pad) as im2col folded into GEMM packing.

For image ``n`` and group ``g`` the output is ``W_g (M x K) @ col (K x P)`` with ``K`` =
``C/G * kh * kw`` and ``P`` the output pixels. ``k_im2col`` writes ``col`` straight into the
GEMM's packed panel layout (no separate im2col matrix, then pack), the weights are packed per
group, and the GEMM epilogue adds the bias and writes NCHW directly. Window geometry (pads,
auto_pad, output sizes) is ``ir.window.window_geometry``, the CPU backend's too, so both agree
by construction.
"""

from __future__ import annotations

from anychip.backends.opencl.driver import ClTensor
from anychip.backends.opencl.kernels._common import ctype, dev, launch1d
from anychip.backends.opencl.kernels.op_matmul import gemm_packed, pack, source
from anychip.backends.opencl.kernels.table import F, kernel
from anychip.errors import KernelError
from anychip.ir.window import window_geometry

__all__ = ["conv"]


def conv(
    x: ClTensor,
    w: ClTensor,
    b: ClTensor | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    relu: bool = False,
) -> ClTensor:
    """ONNX Conv for 1-D and 2-D inputs (``relu``: apply ReLU in the epilogue)."""
    d = dev(x, w, b)
    ct = ctype(x.dtype, "Conv")
    if x.ndim not in (3, 4) or w.ndim != x.ndim:
        raise KernelError(f"Conv on OpenCL takes 1-D or 2-D images, got X {list(x.shape)}")
    nsp = x.ndim - 2
    ks = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    g = window_geometry(
        x.shape[2:], ks, strides=strides, dilations=dilations, pads=pads, auto_pad=auto_pad
    )
    n, c = x.shape[:2]
    m = w.shape[0]
    if c % group or m % group or w.shape[1] * group != c:
        raise KernelError(f"Conv: X {list(x.shape)}, W {list(w.shape)} and group={group} differ")
    # 1-D is 2-D with a height of 1.
    hw = (1, *x.shape[2:]) if nsp == 1 else x.shape[2:]
    kh, kw = (1, ks[0]) if nsp == 1 else ks
    oh, ow = (1, g.out[0]) if nsp == 1 else g.out
    sh, sw = (1, g.strides[0]) if nsp == 1 else g.strides
    dh, dw = (1, g.dilations[0]) if nsp == 1 else g.dilations
    ph, pw = (0, g.begin[0]) if nsp == 1 else g.begin
    y = d.empty((n, m, *g.out), x.dtype)
    if y.size == 0:
        return y
    mg, cg = m // group, c // group
    k = cg * kh * kw
    p = oh * ow
    p8 = -(-p // 8)
    cols = d.empty((n * group, p8, k, 8), x.dtype)
    meta = d.meta((c, hw[0], hw[1], group, cg, kh, kw, ow, p, sh, sw, ph, pw, dh, dw, p8, k))
    launch1d(d, "gemm", ct, "k_im2col", source, cols.size // 8, [x.buffer, cols.buffer, meta])
    wp = w.derived(("conv", group), lambda: pack(w, [group], [mg * k], mg, k, k, 1))
    try:
        gemm_packed(
            d, wp, cols, y, mg, p, k, batch=n * group, a_mod=group, b_mod=n * group,
            c_bs=mg * p, c_rs=p, beta=1.0, bias=b, bias_strides=(mg, 1, 0), relu=relu,
        )  # fmt: skip
    finally:
        cols.release()
    return y


@kernel("Conv", since=1, dtypes=F)
def conv_kernel(x, w, b=None, **attrs):
    return conv(x, w, b, **attrs)
