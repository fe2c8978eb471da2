"""Integer products through oneDNN's int8 matmul, exactly, where the CPU has VNNI or AMX.

``MatMulInteger``, ``QLinearMatMul``, ``QGemm`` and the dynamic quantization chains need
``(A - a_zp) @ (B - b_zp)`` accumulated in int32. oneDNN's int8 matmul takes ``u8``/``s8``
activations and ``s8`` weights and accumulates in ``s32``; with VNNI (``vpdpbusd``) or AMX
tiles every product is summed exactly. Without them its ``u8 x s8`` pairs pass through a
saturating 16-bit add (``vpmaddubsw``), which is not exact: a primitive whose implementation
is neither a VNNI nor an AMX one is declined (``Unsupported``), whatever the flags say (the
user may cap oneDNN's ISA with ``ONEDNN_MAX_CPU_ISA``), and the caller keeps its float path.

The raw product ``R = A @ B8`` (``B8 = B - 128`` for ``u8`` weights: oneDNN's CPU matmul
takes ``s8`` weights only) is corrected in place, in int32, with the zero points (int32
arithmetic wraps modulo 2**32, so the result is exact wherever the true one fits in int32,
which ONNX's int32 accumulation asks anyway):

    (A - za) @ (B8 - zb') = R - za * colsum(B8) - zb' * rowsum(A) + K * za * zb'

with ``zb' = zb - 128`` for ``u8`` weights, ``za`` per row or common, ``zb`` per column or
common. B's packed layout and its column sums are kept per weight array
(``_prim.weights``). A raw product that could overflow int32 (``K`` above 65,000 for 8-bit
operands) is declined.
"""

from __future__ import annotations

import math

import numpy as np

from anychip.backends.cpu.features import cpu_flags
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C, get, omp_threads, team_for

__all__ = ["MIN_MACS", "exact_here", "int_matmul"]

#: Below this many multiply-adds the float path's numpy call costs less than oneDNN's.
MIN_MACS = 1 << 16
#: Under this many multiply-adds an int8 product runs on one OpenMP thread (``team_for``):
#: 8-bit products run 8-16x as many per cycle as float32 ones on AMX, so the team's wake-up
#: pays later than for ``_lib.MATMUL_SMALL_WORK``. 64x1024x1024 (2^26), Sapphire Rapids,
#: busy machine, primitive alone: 115 us at one thread, 161 at two.
TEAM_WORK = 1 << 27
#: Implementations whose u8 x s8 sums are exact (``impl_info`` names the ISA).
_EXACT_ISA = ("vnni", "amx")
_WIDE = (1 << 31) // (255 * 128)  # the longest K whose raw 8-bit sums fit in int32


def exact_here() -> bool:
    """Whether this CPU has instructions that sum 8-bit products exactly (VNNI or AMX)."""
    flags = cpu_flags()
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


def int_matmul(
    a: np.ndarray,
    b: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
    trans_b: bool = False,
) -> np.ndarray | None:
    """``(a - a_zero_point) @ (b - b_zero_point)`` in int32, for 8-bit ``a`` ``[..., M, K]``
    and 8-bit 2-D ``b`` ``[K, N]`` (``[N, K]`` with ``trans_b``: Gemm's transB); None where
    oneDNN's int8 product is not exact here, not worth its call, or the operands are of other
    kinds (the caller computes it)."""
    if get() is None or a.dtype.kind not in "iu" or b.dtype.kind not in "iu":
        return None
    if a.itemsize != 1 or b.itemsize != 1 or a.ndim < 2 or b.ndim != 2 or not exact_here():
        return None
    m, (k, n) = math.prod(a.shape[:-1]), (b.shape[::-1] if trans_b else b.shape)
    if a.shape[-1] != k or m * k * n < MIN_MACS or k > _WIDE or 0 in (m, k, n):
        return None
    za = _zero_point(a_zero_point, m, a.shape, rows=True)
    zb = _zero_point(b_zero_point, n, b.shape, rows=False)
    if za is None or zb is None:
        return None
    src = C.u8 if a.dtype == np.uint8 else C.s8
    with team_for(m * k * n, TEAM_WORK):
        return _product(a, b, (m, k, n), src, za, zb, trans_b)


def _product(
    a: np.ndarray, b: np.ndarray, dims: tuple[int, int, int], src: int, za: np.ndarray,
    zb: np.ndarray, trans_b: bool,
) -> np.ndarray | None:  # fmt: skip
    m, k, n = dims
    threads = omp_threads()  # a primitive is made for its team's size
    try:
        entry = P.cached(("int8-matmul", m, k, n, src, threads), lambda: _build(m, k, n, src))
        # packed for this primitive: its layout (and an s8 source's compensation) depend on
        # the rows and the source's type
        packed = P.weights(
            ("int8-matmul-w", m, k, n, src, trans_b), (b,), lambda: _pack(entry, b, trans_b)
        )
        colsum = P.weights(("int8-colsum", k, n, trans_b), (b,), lambda: _colsum(b, trans_b))
    except P.Unsupported:
        return None
    a2 = np.ascontiguousarray(a).reshape(m, k)
    raw = np.empty((m, n), np.int32)
    entry.run({C.arg_src: a2, C.arg_weights: packed, C.arg_dst: raw})
    y = raw
    shift = 128 if b.dtype == np.uint8 else 0  # B8 = B - 128
    zb = zb - shift
    with np.errstate(over="ignore"):  # modulo 2**32 (the module docstring)
        if np.any(za):
            y -= (za * colsum[None, :]).astype(np.int32)
        if np.any(zb):
            y -= (zb * a2.sum(axis=1, dtype=np.int64)[:, None]).astype(np.int32)
            if np.any(za):
                y += (k * za * zb).astype(np.int32)
    return y.reshape(a.shape[:-1] + (n,))


def _zero_point(zp: np.ndarray | None, count: int, shape: tuple, rows: bool) -> np.ndarray | None:
    """A zero point as int64, broadcastable against ``[M, N]``: common, per row of A (``[M]``
    or ``[..., M, 1]``) or per column of B (``[N]``); None for any other form."""
    if zp is None:
        return np.zeros((), np.int64)
    z = np.asarray(zp)
    if z.dtype.kind not in "iu":
        return None
    z = z.astype(np.int64)
    if z.size == 1:
        return z.reshape(())
    if z.size != count:
        return None
    return z.reshape(-1, 1) if rows else z.reshape(1, -1)


class _Int8:
    __slots__ = ("prim", "w_md", "key")

    def __init__(self, prim: P.Prim, w_md: object, key: tuple) -> None:
        self.prim, self.w_md, self.key = prim, w_md, key

    def run(self, buffers: dict) -> None:
        self.prim.run(buffers)


def _build(m: int, k: int, n: int, src: int) -> _Int8:
    L = P.lib()
    pd = P.make_pd(
        L.dnnl.dnnl_matmul_primitive_desc_create,
        L.engine,
        P.md((m, k), C.ab, src),
        P.md((k, n), C.any, C.s8),
        L.ffi.NULL,
        P.md((m, n), C.ab, C.s32),
        L.ffi.NULL,
    )
    info = P.impl_info(pd)
    if not any(isa in info for isa in _EXACT_ISA):
        raise P.Unsupported(f"oneDNN chose {info}: its 8-bit sums may saturate")
    w_md = P.query_md(pd, C.query_weights_md)
    args = {
        C.arg_src: P.md((m, k), C.ab, src),
        C.arg_weights: w_md,
        C.arg_dst: P.md((m, n), C.ab, C.s32),
    }
    return _Int8(P.Prim(pd, args), w_md, (m, k, n, src))


def _as_s8(b: np.ndarray, trans_b: bool = False) -> np.ndarray:
    """``b`` (transposed with ``trans_b``) as contiguous int8: itself, or ``b - 128`` for
    uint8 (the top bit flipped)."""
    b = np.ascontiguousarray(b.T if trans_b else b)
    if b.dtype == np.int8:
        return b
    return (b.view(np.uint8) ^ np.uint8(0x80)).view(np.int8)


def _pack(entry: _Int8, b: np.ndarray, trans_b: bool) -> np.ndarray:
    buf = np.empty(max(1, P.md_size(entry.w_md)), np.uint8)  # the packed s8 layout's bytes
    b8 = _as_s8(b, trans_b)
    P.reorder_into(("int8-w", *entry.key), b8, P.md(b8.shape, C.ab, C.s8), buf, entry.w_md)
    return buf


def _colsum(b: np.ndarray, trans_b: bool) -> np.ndarray:
    """The column sums of ``b`` as int8 (``_as_s8``), in int64."""
    return _as_s8(b, trans_b).sum(axis=0, dtype=np.int64)
