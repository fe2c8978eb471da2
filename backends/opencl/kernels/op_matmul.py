"""MatMul and Gemm: packed operands, register tiles of 8-wide vectors.

The shape of a CPU BLAS kernel, written once in OpenCL C: ``B`` (K x N) is packed into panels
of 8 columns (``[N/8][K][8]``, zero-padded; a weight's panels are kept with it). Two tile
kernels, each step ``c += a * b`` with a scalar ``a`` and a vector ``b`` (plain ``*`` and
``+``: the ``fma()`` built-in is not inlined by PoCL and costs 10x):

* ``k_gemm_d6`` reads a row-major ``A`` in place (no packing launch): one work-item computes
  a 6x16 tile of ``C`` in twelve ``T8`` accumulators (BLIS's AVX2 shape: 12 accumulators,
  2 vectors of B and a broadcast fit the 16 registers), its six rows of ``A`` read as six
  streams. MatMul whenever A's batch axes are whole (or absent), Gemm without ``transA``.
* ``k_gemm`` reads ``A`` packed into 8-row panels (``[M/8][K][8]``) and computes 8x8 tiles:
  for a transposed or batch-broadcast ``A`` and for Conv, whose im2col is written straight
  into the panel layout (``op_conv.py``). Packing reads any strides.

The epilogue applies ``alpha``, ``beta * C`` (broadcast through strides) and an optional ReLU.
Measured on PoCL at 1 thread (GFLOP/s, packed 8x8 -> in-place 6x16): 256^3 59 -> 82, 512^3
72 -> 94, 1024^3 81 -> 99, 64x768x3072 69 -> 73; ``bench/opencl.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from anychip.backends.opencl.driver import ClDevice, ClTensor
from anychip.backends.opencl.kernels._common import (
    collapse,
    contiguous_strides,
    ctype,
    dev,
    launch,
    launch1d,
)
from anychip.backends.opencl.kernels.table import F, kernel
from anychip.errors import KernelError

__all__ = ["gemm_packed", "pack", "source"]


_ROWS = "\n".join(f"        c{r} += ak[{r}] * bv;" for r in range(8))
_STORE = "\n".join(f"    store_row(cb, bias, c{r}, row0 + {r}, col0, ctx);" for r in range(8))


def source() -> str:
    """The ``gemm`` program: packing (strided and im2col) and the tile kernel."""
    return (
        r"""
typedef struct { int M, N, c_rs, has_bias, bias_rs, bias_cs, act, b_off; T alpha, beta; } Ctx;
__kernel void k_pack(__global const T* x, __global T* p, __global const int* m, int rows,
                     int K, int R8, int n) {
    /* p[b][R8][K][8] <- x[b, r, k] (rows >= `rows` are 0); m: nd, shape, strides of (b, r, k)
       collapsed over the batch axes only: m = [nb, bshape.., bstride.., rs, ks] */
    int i = get_global_id(0); if (i >= n) return;   /* one (b, r8, k): 8 lanes */
    int k = i % K; int t = i / K; int r8 = t % R8; int b = t / R8;
    int nb = m[0]; int off = 0; int q = b;
    for (int d = nb - 1; d >= 0; --d) { int s = m[1 + d]; off += (q % s) * m[1 + nb + d]; q /= s; }
    int rs = m[1 + 2 * nb];
    off += r8 * 8 * rs + k * m[2 + 2 * nb];
    int lim = min(8, rows - r8 * 8);
    __global T* o = p + (long)i * 8;  /* 8 plain stores: PoCL calls vstore8 out of line */
    if (lim == 8) {
        for (int l = 0; l < 8; ++l) o[l] = x[off + l * rs];
    } else {
        for (int l = 0; l < 8; ++l) o[l] = l < lim ? x[off + l * rs] : (T)0;
    }
}
inline void store_row(__global T* cb, __global const T* bias, T8 v, int row, int col0,
                      Ctx c) {
    if (row >= c.M) return;
    T t[8] = {v.s0, v.s1, v.s2, v.s3, v.s4, v.s5, v.s6, v.s7};  /* no vstore8 (out of line) */
    int lim = min(8, c.N - col0);
    for (int l = 0; l < lim; ++l) {
        T z = c.alpha * t[l];
        if (c.has_bias) z += c.beta * bias[c.b_off + row * c.bias_rs + (col0 + l) * c.bias_cs];
        if (c.act == 1) z = z < (T)0 ? (T)0 : z;  /* NaN stays NaN, as Relu */
        cb[row * c.c_rs + col0 + l] = z;
    }
}
"""
        + r"""
__kernel void k_gemm(__global const T* Ap, __global const T8* Bp, __global T* C,
                     __global const T* bias, int M, int N, int K, int M8, int N8,
                     int a_mod, int b_mod, int c_bs, int c_rs, T alpha, T beta, int has_bias,
                     int bias_bs, int bias_rs, int bias_cs, int act) {
    int j8 = get_global_id(0), i8 = get_global_id(1), b = get_global_id(2);
    if (j8 >= N8 || i8 >= M8) return;
    __global const T* a = Ap + ((long)(b % a_mod) * M8 + i8) * K * 8;
    __global const T8* bp = Bp + ((long)(b % b_mod) * N8 + j8) * K;
    T8 c0 = (T8)0, c1 = (T8)0, c2 = (T8)0, c3 = (T8)0;
    T8 c4 = (T8)0, c5 = (T8)0, c6 = (T8)0, c7 = (T8)0;
    for (int k = 0; k < K; ++k) {
        __global const T* ak = a + k * 8; T8 bv = bp[k];
"""
        + _ROWS
        + r"""
    }
    Ctx ctx; ctx.M = M; ctx.N = N; ctx.c_rs = c_rs; ctx.has_bias = has_bias;
    ctx.bias_rs = bias_rs; ctx.bias_cs = bias_cs; ctx.act = act; ctx.alpha = alpha;
    ctx.beta = beta; ctx.b_off = (b % a_mod) * bias_bs;
    __global T* cb = C + (long)b * c_bs;
    int row0 = i8 * 8, col0 = j8 * 8;
"""
        + _STORE
        + "\n}\n"
        + _D6
        + _IM2COL
    )


_D6 = r"""
__kernel void k_gemm_d6(__global const T* A, __global const T8* Bp, __global T* C,
                        __global const T* bias, int M, int N, int K, int M6, int N16,
                        int a_mod, int b_mod, int c_bs, int c_rs, T alpha, T beta,
                        int has_bias, int bias_bs, int bias_rs, int bias_cs, int act,
                        int lda, int a_bs, int N8) {
    /* a 6x16 tile: twelve 8-wide accumulators (the 6x16 shape of BLIS's AVX2 kernels) */
    int j16 = get_global_id(0), i6 = get_global_id(1), b = get_global_id(2);
    if (j16 >= N16 || i6 >= M6) return;
    int row0 = i6 * 6, col0 = j16 * 16;
    int two = 2 * j16 + 1 < N8;
    __global const T* a = A + (long)(b % a_mod) * a_bs;
    __global const T* a0 = a + (long)min(row0 + 0, M - 1) * lda;
    __global const T* a1 = a + (long)min(row0 + 1, M - 1) * lda;
    __global const T* a2 = a + (long)min(row0 + 2, M - 1) * lda;
    __global const T* a3 = a + (long)min(row0 + 3, M - 1) * lda;
    __global const T* a4 = a + (long)min(row0 + 4, M - 1) * lda;
    __global const T* a5 = a + (long)min(row0 + 5, M - 1) * lda;
    __global const T8* p0 = Bp + ((long)(b % b_mod) * N8 + 2 * j16) * K;
    __global const T8* p1 = two ? p0 + K : p0;
    T8 c00 = (T8)0, c01 = (T8)0;
    T8 c10 = (T8)0, c11 = (T8)0;
    T8 c20 = (T8)0, c21 = (T8)0;
    T8 c30 = (T8)0, c31 = (T8)0;
    T8 c40 = (T8)0, c41 = (T8)0;
    T8 c50 = (T8)0, c51 = (T8)0;
    for (int k = 0; k < K; ++k) {
        T8 b0 = p0[k], b1 = p1[k];
        T x0 = a0[k]; c00 += x0 * b0; c01 += x0 * b1;
        T x1 = a1[k]; c10 += x1 * b0; c11 += x1 * b1;
        T x2 = a2[k]; c20 += x2 * b0; c21 += x2 * b1;
        T x3 = a3[k]; c30 += x3 * b0; c31 += x3 * b1;
        T x4 = a4[k]; c40 += x4 * b0; c41 += x4 * b1;
        T x5 = a5[k]; c50 += x5 * b0; c51 += x5 * b1;
    }
    Ctx ctx; ctx.M = M; ctx.N = N; ctx.c_rs = c_rs; ctx.has_bias = has_bias;
    ctx.bias_rs = bias_rs; ctx.bias_cs = bias_cs; ctx.act = act; ctx.alpha = alpha;
    ctx.beta = beta; ctx.b_off = (b % a_mod) * bias_bs;
    __global T* cb = C + (long)b * c_bs;
    store_row(cb, bias, c00, row0 + 0, col0, ctx);
    if (two) store_row(cb, bias, c01, row0 + 0, col0 + 8, ctx);
    store_row(cb, bias, c10, row0 + 1, col0, ctx);
    if (two) store_row(cb, bias, c11, row0 + 1, col0 + 8, ctx);
    store_row(cb, bias, c20, row0 + 2, col0, ctx);
    if (two) store_row(cb, bias, c21, row0 + 2, col0 + 8, ctx);
    store_row(cb, bias, c30, row0 + 3, col0, ctx);
    if (two) store_row(cb, bias, c31, row0 + 3, col0 + 8, ctx);
    store_row(cb, bias, c40, row0 + 4, col0, ctx);
    if (two) store_row(cb, bias, c41, row0 + 4, col0 + 8, ctx);
    store_row(cb, bias, c50, row0 + 5, col0, ctx);
    if (two) store_row(cb, bias, c51, row0 + 5, col0 + 8, ctx);
}
"""

_IM2COL = r"""
__kernel void k_im2col(__global const T* x, __global T* p, __global const int* m, int n) {
    /* p[n*G + g][P8][K][8] <- the window element k of output pixels 8*p8.. of image n, group
       g; one work-item per (n*G + g, p8, k), 8 lanes.
       m = [C, H, W, G, Cg, KH, KW, OW, P, sh, sw, ph, pw, dh, dw, P8, K] */
    int i = get_global_id(0); if (i >= n) return;
    int K = m[16], P8 = m[15];
    int k = i % K; int t = i / K; int p8 = t % P8; int bb = t / P8;
    int G = m[3], KH = m[5], KW = m[6], OW = m[7], P = m[8], H = m[1], W = m[2];
    int nimg = bb / G, g = bb % G;
    int kx = k % KW; int ky = (k / KW) % KH; int c = g * m[4] + k / (KW * KH);
    __global const T* xc = x + ((long)nimg * m[0] + c) * H * W;
    int px = p8 * 8; int oy = px / OW, ox = px % OW;
    int dy = ky * m[13] - m[11], dx = kx * m[14] - m[12];
    __global T* o = p + (long)i * 8;  /* plain stores: PoCL calls vstore8 out of line */
    for (int l = 0; l < 8; ++l) {
        int iy = oy * m[9] + dy, ix = ox * m[10] + dx;
        bool in = px + l < P && iy >= 0 && iy < H && ix >= 0 && ix < W;
        o[l] = in ? xc[iy * W + ix] : (T)0;
        if (++ox == OW) { ox = 0; ++oy; }
    }
}
"""


def pack(
    x: ClTensor,
    batch: Sequence[int],
    bstrides: Sequence[int],
    rows: int,
    k: int,
    rs: int,
    ks: int,
) -> ClTensor:
    """Panels ``[batch][rows/8][k][8]`` of ``x[b, r, k]`` read through the given strides."""
    d = dev(x)
    ct = ctype(x.dtype, "MatMul")
    r8 = -(-rows // 8)
    nb = int(np.prod(batch, dtype=np.int64)) if len(batch) else 1
    out = d.empty((nb, r8, k, 8), x.dtype)
    bdims, (bst,) = collapse(list(batch) or [1], [list(bstrides) or [0]])
    meta = d.meta((len(bdims), *bdims, *bst, rs, ks))
    args = [x.buffer, out.buffer, meta, np.int32(rows), np.int32(k), np.int32(r8)]
    launch1d(d, "gemm", ct, "k_pack", source, out.size // 8, args)
    return out


def gemm_packed(
    d: ClDevice,
    ap: ClTensor,
    bp: ClTensor,
    c: ClTensor,
    m: int,
    n: int,
    k: int,
    *,
    batch: int,
    a_mod: int,
    b_mod: int,
    c_bs: int,
    c_rs: int,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias: ClTensor | None = None,
    bias_strides: tuple[int, int, int] = (0, 0, 0),
    relu: bool = False,
    direct: tuple[int, int] | None = None,
) -> None:
    """``C[b] = alpha * A[b % a_mod] @ B[b % b_mod] + beta * bias`` into ``c`` (strided).
    ``direct=(lda, a_bs)``: ``ap`` is A itself, row-major (row and batch strides), unpacked."""
    ct = ctype(c.dtype, "MatMul")
    name, tail, gsize, lsize = _launch_plan(
        d.info.max_work_group, c.dtype.str, m, n, k, batch, a_mod, b_mod, c_bs, c_rs, alpha,
        beta, bias is not None, tuple(bias_strides), relu, direct,
    )  # fmt: skip
    args = [ap.buffer, bp.buffer, c.buffer, (bias if bias is not None else c).buffer, *tail]
    launch(d, "gemm", ct, name, source, gsize, args, lsize)


@lru_cache(maxsize=1024)
def _launch_plan(
    max_wg,
    dtype,
    m,
    n,
    k,
    batch,
    a_mod,
    b_mod,
    c_bs,
    c_rs,
    alpha,
    beta,
    has_bias,
    bias_strides,
    relu,
    direct,
):
    """The kernel name, scalar arguments and geometry of one GEMM shape (kept: a model calls
    the same shapes every run, and building them cost as much as the enqueue)."""
    m8, n8 = -(-m // 8), -(-n // 8)
    T = np.dtype(dtype).type
    tm, tn = (-(-m // 6), -(-n // 16)) if direct is not None else (m8, n8)
    args = [np.int32(v) for v in (m, n, k, tm, tn, a_mod, b_mod, c_bs, c_rs)]
    args += [T(alpha), T(beta), np.int32(has_bias)]
    args += [np.int32(v) for v in bias_strides] + [np.int32(relu)]
    # A 4x4 block of tiles per work-group: its 4 A and 4 B panels stay in cache while the
    # group runs (PoCL runs a group on one thread); 1-D groups of 8 were 5-30% slower.
    lx, ly = min(tn, 4), min(tm, 4)
    while lx * ly > max_wg and ly > 1:
        ly //= 2
    lx = max(1, min(lx, max_wg // ly))
    gx = -(-tn // lx) * lx
    gy = -(-tm // ly) * ly
    name = "k_gemm"
    if direct is not None:
        name = "k_gemm_d6"
        args += [np.int32(direct[0]), np.int32(direct[1]), np.int32(n8)]
    return name, tuple(args), (gx, gy, batch), (lx, ly, 1)


def _batch_strides(shape: tuple[int, ...], batch: Sequence[int], mat: int) -> list[int]:
    """Element strides of ``shape``'s batch axes broadcast to ``batch`` (0 where broadcast)."""
    lead = len(batch) - len(shape)
    st = [s * mat for s in contiguous_strides(shape)]
    out = []
    for i in range(len(batch)):
        j = i - lead
        out.append(0 if j < 0 or shape[j] == 1 else st[j])
    return out


@kernel("MatMul", since=1, dtypes=F)
def matmul(a: ClTensor, b: ClTensor) -> ClTensor:
    d = dev(a, b)
    if a.dtype != b.dtype:
        raise KernelError(f"MatMul: input dtypes differ ({a.dtype} and {b.dtype})")
    out_shape, batch, nb, m, k, n, bst, ast, direct = _mm_plan(a.shape, b.shape)
    y = d.empty(out_shape, a.dtype)
    if y.size == 0:
        return y
    if k == 0:
        return _zeros(y)
    # B is most often a weight: its panels are kept with it and packed once per session.
    bp = b.derived(("B", batch, bst), lambda: pack(b, batch, bst, n, k, 1, n))
    if direct is not None:
        # A read in place by the 6x16 kernel: no packing launch, and faster at every size
        # measured (bench/opencl.py).
        gemm_packed(
            d, a, bp, y, m, n, k, batch=nb, a_mod=nb, b_mod=nb, c_bs=m * n, c_rs=n,
            direct=direct,
        )  # fmt: skip
        return y
    ap = pack(a, batch, ast, m, k, k, 1)
    try:
        gemm_packed(d, ap, bp, y, m, n, k, batch=nb, a_mod=nb, b_mod=nb, c_bs=m * n, c_rs=n)
    finally:
        ap.release()
    return y


@lru_cache(maxsize=1024)
def _mm_plan(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple:
    """Shapes, batch strides and the A path of one MatMul shape pair (kept per shape)."""
    if not a_shape or not b_shape:
        raise KernelError(f"MatMul: inputs must have rank >= 1, got {a_shape} and {b_shape}")
    ash = (1, *a_shape) if len(a_shape) == 1 else a_shape
    bsh = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    m, k = ash[-2:]
    k2, n = bsh[-2:]
    if k != k2:
        raise KernelError(f"MatMul: inner dimensions differ: {a_shape} @ {b_shape}")
    try:
        batch = tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
    except ValueError:
        raise KernelError(f"MatMul: batch axes of {a_shape} and {b_shape} differ") from None
    out_shape = [*batch, m, n]
    if len(a_shape) == 1:
        del out_shape[-2]
    if len(b_shape) == 1:
        del out_shape[-1]
    nb = int(np.prod(batch, dtype=np.int64)) if batch else 1
    bst = tuple(_batch_strides(bsh[:-2], batch, k * n))
    ast = tuple(_batch_strides(ash[:-2], batch, m * k))
    na = int(np.prod(ash[:-2], dtype=np.int64)) if len(ash) > 2 else 1
    direct = None
    if na in (1, nb):  # A's batches are whole matrices (or one): read in place
        direct = (k, 0 if na == 1 else m * k)
    return tuple(out_shape), batch, nb, m, k, n, bst, ast, direct


def _zeros(y: ClTensor) -> ClTensor:
    import pyopencl as cl

    cl.enqueue_fill_buffer(y.device.queue, y.buffer, np.zeros(1, y.dtype), 0, y.nbytes)
    return y


def _gemm(a, b, c, alpha, beta, trans_a, trans_b, op):
    d = dev(a, b, c)
    if a.ndim != 2 or b.ndim != 2:
        raise KernelError(f"{op}: A and B must be matrices, got {a.shape} and {b.shape}")
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    k2, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != k2:
        raise KernelError(f"{op}: inner dimensions differ: {a.shape} and {b.shape}")
    y = d.empty((m, n), a.dtype)
    if y.size == 0:
        return y
    if c is not None:
        try:
            np.broadcast_shapes(c.shape, (m, n))
        except ValueError:
            raise KernelError(f"{op}: C {list(c.shape)} does not broadcast to {[m, n]}") from None
    cst = _batch_strides(c.shape, [m, n], 1) if c is not None else [0, 0]
    strides = (k, 1) if trans_b else (1, n)
    bp = b.derived(("B", strides), lambda: pack(b, [], [], n, k, *strides))
    ap = pack(a, [], [], m, k, 1, m) if trans_a else a  # A^T is packed, A read in place
    try:
        gemm_packed(
            d, ap, bp, y, m, n, k, batch=1, a_mod=1, b_mod=1, c_bs=0, c_rs=n, alpha=alpha,
            beta=beta if c is not None else 0.0, bias=c, bias_strides=(0, cst[0], cst[1]),
            direct=None if trans_a else (k, 0),
        )  # fmt: skip
    finally:
        if ap is not a:
            ap.release()
    return y


@kernel("Gemm", since=7, dtypes=F)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    return _gemm(a, b, c, alpha, beta, transA, transB, "Gemm")
