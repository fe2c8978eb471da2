"""``anychip::FusedAttention`` on OpenCL: ``softmax(Q @ Kt (/ or *) scale [+ mask]) @ V`` in
one launch.

The shared ``FuseAttentionPass`` also runs on OpenCL partitions (``backends/opencl/__init__.py``),
so the eight launches of the unfused nodes (pack, pack, GEMM, Div, [Add,] Softmax, pack, pack,
GEMM) become one. Two kernels, each a program family of its own, chosen by ``variant()``:

* ``k_attn_rows`` (CPU devices, and any row too long for local memory): one work-item per four
  query rows (four independent accumulators share each vector load of ``Kt`` and ``V``: 2x
  faster than one row); the scores 8 columns at a time in 8-wide vectors (``Kt``'s row loaded
  through an aligned vector pointer: PoCL does not inline ``vload8``, which cost 4x), then the
  maximum, ``exp(s - max)`` and its sum (float32: ``exp`` of 8 lanes at once, 2x faster than
  scalar calls), then the output 8 columns at a time, divided by the sum. Rows
  in a global scratch buffer (cache-resident). Sizes or offsets not multiples of 8 take the
  scalar loops. Work-groups of up to 64 rows, fewer while there would be fewer than four
  groups per compute unit.
* ``k_attn_group`` (GPUs and accelerators): one work-group per query row; its work-items take
  the scores column by column, reduce the maximum and the sum in local memory (a tree over
  the group), then take the output's columns: adjacent work-items read adjacent columns of
  ``Kt`` and ``V`` (coalesced). Group size: the smallest power of two covering the longer of
  ``S_kv`` and ``D_v``, capped by the device's ``max_work_group_size`` and 256; used when the
  row of scores and the reduction array fit the device's ``local_mem_size``.

Both run the unfused nodes' operations in their order (dot product, scale, mask, stable
softmax). Batch axes broadcast: every operand's offset per batch entry comes from a small
table built on the host. PoCL runs both, so the tests check both against onnxruntime.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from anychip.backends.opencl.driver import ClDevice, ClTensor
from anychip.backends.opencl.kernels._common import contiguous_strides, ctype, dev, launch
from anychip.backends.opencl.kernels.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["fused_attention", "source", "group_size", "rows_group", "variant", "FORCE"]

#: the kernel every call runs (``"group"`` or ``"rows"``), None: ``variant()`` chooses (tests
#: run both on one device)
FORCE: str | None = None

_BODY = r"""
__kernel void NAME(__global const T* q, __global const T* kt, __global const T* v,
                   __global const T* mask, __global T* y, __global const int* offs,
                   SPACE T* scores, __local T* red, int S, int D, int Skv, int Dv,
                   int m_rs, int m_cs, int has_mask, T scale, int divide) {
    int lid = get_local_id(0), L = get_local_size(0);
    int i = get_global_id(1), b = get_global_id(2);
    __global const T* qr = q + offs[4 * b] + (long)i * D;
    __global const T* kb = kt + offs[4 * b + 1];
    __global const T* vb = v + offs[4 * b + 2];
    __global const T* mr = mask + offs[4 * b + 3] + (long)i * m_rs;
    SPACE T* sr = scores;
    T mx = -INFINITY;
    for (int c = lid; c < Skv; c += L) {
        T acc = (T)0;
        for (int k = 0; k < D; ++k) acc += qr[k] * kb[(long)k * Skv + c];
        acc = divide ? acc / scale : acc * scale;
        if (has_mask) acc += mr[(long)c * m_cs];
        sr[c] = acc;
        mx = fmax(mx, acc);
    }
    red[lid] = mx;
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    for (int h = L / 2; h > 0; h >>= 1) {
        if (lid < h) red[lid] = fmax(red[lid], red[lid + h]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    mx = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    T sum = (T)0;
    for (int c = lid; c < Skv; c += L) { T e = exp(sr[c] - mx); sr[c] = e; sum += e; }
    red[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    for (int h = L / 2; h > 0; h >>= 1) {
        if (lid < h) red[lid] += red[lid + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    T r = (T)1 / red[0];
    __global T* yr = y + ((long)b * S + i) * Dv;
    for (int d = lid; d < Dv; d += L) {
        T acc = (T)0;
        for (int c = 0; c < Skv; ++c) acc += sr[c] * vb[(long)c * Dv + d];
        yr[d] = acc * r;
    }
}
"""


_ROWS = r"""
/* four query rows per work-item: four independent accumulators share each load of Kt and V */
#define ROW(r) (i0 + min(r, nr - 1))
#define SCALE(a) a = divide ? a / scale : a * scale
#define MASK8(a, r) if (has_mask) { \
        __global const T* mc = mb + (long)ROW(r) * m_rs + (long)c * m_cs; \
        a += mvec ? *(__global const T8*)mc : (T8)(mc[0], mc[m_cs], mc[2 * m_cs], \
            mc[3 * m_cs], mc[4 * m_cs], mc[5 * m_cs], mc[6 * m_cs], mc[7 * m_cs]); }
#define MASK1(a, r) if (has_mask) a += mb[(long)ROW(r) * m_rs + (long)c * m_cs]
__kernel void k_attn_rows(__global const T* q, __global const T* kt, __global const T* v,
                          __global const T* mask, __global T* y, __global const int* offs,
                          __global T* scores, int S, int D, int Skv, int Dv, int m_rs,
                          int m_cs, int has_mask, T scale, int divide, int vec, int mvec,
                          int n) {
    int g = get_global_id(0); if (g >= n) return;
    int S4 = (S + 3) / 4;
    int b = g / S4, i0 = (g % S4) * 4, nr = min(4, S - i0);
    __global const T* qb = q + offs[4 * b];
    __global const T* kb = kt + offs[4 * b + 1];
    __global const T* vb = v + offs[4 * b + 2];
    __global const T* mb = mask + offs[4 * b + 3];
    __global const T* q0 = qb + (long)ROW(0) * D; __global const T* q1 = qb + (long)ROW(1) * D;
    __global const T* q2 = qb + (long)ROW(2) * D; __global const T* q3 = qb + (long)ROW(3) * D;
    __global T* s0 = scores + (long)g * 4 * Skv;
    __global T* s1 = s0 + Skv; __global T* s2 = s1 + Skv; __global T* s3 = s2 + Skv;
    /* vec: Skv, Dv and every offset are multiples of 8 (else the scalar loops do all) */
    int c8 = vec ? Skv : 0, d8 = vec ? Dv : 0;
    for (int c = 0; c < c8; c += 8) {
        T8 a0 = (T8)0, a1 = (T8)0, a2 = (T8)0, a3 = (T8)0;
        for (int k = 0; k < D; ++k) {
            T8 kv = *(__global const T8*)(kb + k * Skv + c);  /* PoCL does not inline vload8 */
            a0 += q0[k] * kv; a1 += q1[k] * kv; a2 += q2[k] * kv; a3 += q3[k] * kv;
        }
        SCALE(a0); SCALE(a1); SCALE(a2); SCALE(a3);
        MASK8(a0, 0); MASK8(a1, 1); MASK8(a2, 2); MASK8(a3, 3);
        *(__global T8*)(s0 + c) = a0; *(__global T8*)(s1 + c) = a1;
        *(__global T8*)(s2 + c) = a2; *(__global T8*)(s3 + c) = a3;
    }
    for (int c = c8; c < Skv; ++c) {
        T a0 = (T)0, a1 = (T)0, a2 = (T)0, a3 = (T)0;
        for (int k = 0; k < D; ++k) {
            T kv = kb[(long)k * Skv + c];
            a0 += q0[k] * kv; a1 += q1[k] * kv; a2 += q2[k] * kv; a3 += q3[k] * kv;
        }
        SCALE(a0); SCALE(a1); SCALE(a2); SCALE(a3);
        MASK1(a0, 0); MASK1(a1, 1); MASK1(a2, 2); MASK1(a3, 3);
        s0[c] = a0; s1[c] = a1; s2[c] = a2; s3[c] = a3;
    }
    /* the stable softmax of each row, left unnormalised; scalar built-ins only (PoCL calls
       vector ones such as fmax on double8 out of line, with an ABI mismatch) */
    T inv[4];
    for (int r = 0; r < 4; ++r) {
        __global T* sr = s0 + r * Skv;
        T mx = -INFINITY;
        for (int c = 0; c < Skv; ++c) mx = fmax(mx, sr[c]);
        T sum = (T)0;
        int e8 = 0;
#ifdef VEXP
        /* exp of 8 lanes at once: float8 is one AVX register, double8 would cross the ABI */
        if (vec) {
            T8 acc = (T8)0;
            for (; e8 < Skv; e8 += 8) {
                T8 e = exp(*(__global T8*)(sr + e8) - mx);
                *(__global T8*)(sr + e8) = e;
                acc += e;
            }
            sum = ((acc.s0 + acc.s1) + (acc.s2 + acc.s3)) + ((acc.s4 + acc.s5) + (acc.s6 + acc.s7));
        }
#endif
        for (int c = e8; c < Skv; ++c) { T e = exp(sr[c] - mx); sr[c] = e; sum += e; }
        inv[r] = (T)1 / sum;
    }
    __global T* y0 = y + ((long)b * S + i0) * Dv;
    for (int d = 0; d < d8; d += 8) {
        T8 o0 = (T8)0, o1 = (T8)0, o2 = (T8)0, o3 = (T8)0;
        for (int c = 0; c < Skv; ++c) {
            T8 vv = *(__global const T8*)(vb + c * Dv + d);
            o0 += s0[c] * vv; o1 += s1[c] * vv; o2 += s2[c] * vv; o3 += s3[c] * vv;
        }
        *(__global T8*)(y0 + d) = o0 * inv[0];
        if (nr > 1) *(__global T8*)(y0 + Dv + d) = o1 * inv[1];
        if (nr > 2) *(__global T8*)(y0 + 2 * Dv + d) = o2 * inv[2];
        if (nr > 3) *(__global T8*)(y0 + 3 * Dv + d) = o3 * inv[3];
    }
    for (int d = d8; d < Dv; ++d) {
        T o0 = (T)0, o1 = (T)0, o2 = (T)0, o3 = (T)0;
        for (int c = 0; c < Skv; ++c) {
            T vv = vb[(long)c * Dv + d];
            o0 += s0[c] * vv; o1 += s1[c] * vv; o2 += s2[c] * vv; o3 += s3[c] * vv;
        }
        y0[d] = o0 * inv[0];
        if (nr > 1) y0[Dv + d] = o1 * inv[1];
        if (nr > 2) y0[2 * Dv + d] = o2 * inv[2];
        if (nr > 3) y0[3 * Dv + d] = o3 * inv[3];
    }
}
"""


def source(how: str = "rows", vexp: bool = False) -> str:
    """The program of one variant (``rows`` or ``group``). Each is its own program family:
    PoCL 3.0 built the two kernels in one program for float32, then returned a double
    program without kernels."""
    if how == "group":
        return _BODY.replace("NAME", "k_attn_group").replace("SPACE", "__local")
    return ("#define VEXP\n" if vexp else "") + _ROWS


def group_size(d: ClDevice, skv: int, dv: int) -> int:
    """Work-items per row of the group kernel: a power of two covering ``max(skv, dv)``,
    within the device's ``max_work_group_size`` and 256."""
    cap = max(1, min(d.info.max_work_group, 256))
    cap = 1 << (cap.bit_length() - 1)  # the reductions halve: a power of two
    want = 1 << max(0, (max(skv, dv, 1) - 1).bit_length())
    return min(cap, want)


def rows_group(d: ClDevice, rows: int) -> int:
    """Work-group size of the row kernel: the device's limit (at most 64), smaller while
    there would be fewer than four groups per compute unit."""
    lsz = max(1, min(d.info.max_work_group, 64))
    while lsz > 1 and -(-rows // lsz) < 4 * d.info.compute_units:
        lsz //= 2
    return lsz


def variant(d: ClDevice, skv: int, dv: int, itemsize: int) -> str:
    """``group`` (one work-group per row, scores in local memory) on a GPU or accelerator
    when the row fits its local memory, else ``rows`` (one work-item per four rows, 8-wide
    vectors, scores in a global scratch buffer): what a CPU device runs fastest."""
    if d.info.type == "cpu":
        return "rows"
    fits = (skv + group_size(d, skv, dv)) * itemsize <= d.info.local_mem
    return "group" if fits else "rows"


def _batch_offsets(shape: Sequence[int], batch: Sequence[int]) -> np.ndarray:
    """Element offset of each batch entry (row-major over ``batch``) in a tensor of ``shape``
    whose batch axes broadcast to ``batch``."""
    lead = len(batch) - (len(shape) - 2)
    st = contiguous_strides(shape)
    offs = np.zeros(1, np.int64)
    for ax, size in enumerate(batch):
        j = ax - lead
        step = 0 if j < 0 or shape[j] == 1 else st[j]
        offs = (offs[:, None] + np.arange(size, dtype=np.int64)[None, :] * step).reshape(-1)
    return offs


def _shapes(q: ClTensor, kt: ClTensor, v: ClTensor, mask: ClTensor | None) -> tuple:
    if min(q.ndim, kt.ndim, v.ndim) < 2:
        raise KernelError(
            f"FusedAttention: Q, Kt and V need rank >= 2, got {q.shape}, {kt.shape}, {v.shape}"
        )
    s, dq = q.shape[-2:]
    dk, skv = kt.shape[-2:]
    sv, dv = v.shape[-2:]
    if dq != dk or skv != sv:
        raise KernelError(
            f"FusedAttention: Q {list(q.shape)} @ Kt {list(kt.shape)} @ V {list(v.shape)} "
            "do not chain (inner dimensions differ)"
        )
    try:
        batch = np.broadcast_shapes(q.shape[:-2], kt.shape[:-2], v.shape[:-2])
        if mask is not None:
            full = np.broadcast_shapes((*batch, s, skv), mask.shape)
            if full != (*batch, s, skv):
                raise ValueError
    except ValueError:
        shapes = [list(t.shape) for t in (q, kt, v, mask) if t is not None]
        raise KernelError(f"FusedAttention: shapes {shapes} do not broadcast") from None
    return tuple(batch), s, dq, skv, dv


@kernel("FusedAttention", domain=ANYCHIP_DOMAIN, since=1, dtypes={DType.FLOAT, DType.DOUBLE})
def fused_attention(
    q: ClTensor,
    kt: ClTensor,
    v: ClTensor,
    mask: ClTensor | None = None,
    *,
    scale: float,
    divide: int = 1,
) -> ClTensor:
    """Scaled dot-product attention in one launch (see the module docstring)."""
    d = dev(q, kt, v, mask)
    if any(t is not None and t.dtype != q.dtype for t in (kt, v, mask)):
        raise KernelError("FusedAttention: Q, Kt, V and the mask must have one element type")
    ct = ctype(q.dtype, "FusedAttention")
    batch, s, dd, skv, dv = _shapes(q, kt, v, mask)
    y = d.empty((*batch, s, dv), q.dtype)
    nb = int(np.prod(batch, dtype=np.int64)) if batch else 1
    if y.size == 0:
        return y
    m_rs = m_cs = 0
    cols = [_batch_offsets(t.shape, batch) for t in (q, kt, v)]
    if mask is not None:
        mshape = (1,) * (len(batch) + 2 - mask.ndim) + tuple(mask.shape)
        mst = contiguous_strides(mshape)
        m_rs = 0 if mshape[-2] == 1 else mst[-2]
        m_cs = 0 if mshape[-1] == 1 else mst[-1]
        cols.append(_batch_offsets(mshape, batch))
    else:
        cols.append(np.zeros(nb, np.int64))
    table = np.stack(cols, axis=1)
    if table.size and int(table.max()) >= 2**31:
        raise KernelError("FusedAttention: operands too large for 32-bit offsets")
    return _run(d, ct, q, kt, v, mask, y, table, (nb, s, dd, skv, dv, m_rs, m_cs), scale, divide)


def _run(d, ct, q, kt, v, mask, y, table, dims, scale, divide):
    import pyopencl as cl

    nb, s, dd, skv, dv, m_rs, m_cs = dims
    item = y.dtype.itemsize
    how = FORCE or variant(d, skv, dv, item)
    offs = d.meta(tuple(int(o) for o in table.reshape(-1)))
    args = [q.buffer, kt.buffer, v.buffer, (mask if mask is not None else q).buffer, y.buffer]
    args.append(offs)
    tail = [np.int32(x) for x in (s, dd, skv, dv, m_rs, m_cs, mask is not None)]
    tail += [y.dtype.type(scale), np.int32(divide)]
    if how == "group":
        lsz = group_size(d, skv, dv)
        args += [cl.LocalMemory(skv * item), cl.LocalMemory(lsz * item), *tail]
        src = lambda: source("group")  # noqa: E731
        launch(d, "attention_group", ct, "k_attn_group", src, [lsz, s, nb], args, [lsz, 1, 1])
        return y
    rows = nb * (-(-s // 4))  # work-items: four query rows each
    scratch = d.empty((rows * 4, skv), y.dtype)
    try:
        lsz = rows_group(d, rows)
        vec = skv % 8 == 0 and dv % 8 == 0
        vec = vec and not (table[:, 1:3] % 8).any()
        mvec = vec and m_cs == 1 and m_rs % 8 == 0 and not (table[:, 3] % 8).any()
        args += [scratch.buffer, *tail, np.int32(vec), np.int32(mvec), np.int32(rows)]
        gsz = [-(-rows // lsz) * lsz]
        vexp = ct == "float"
        fam = "attention_rows_vexp" if vexp else "attention_rows"
        launch(d, fam, ct, "k_attn_rows", lambda: source("rows", vexp), gsz, args, [lsz])
    finally:
        scratch.release()  # the in-order queue: a later user of the block runs after
    return y
