"""``A @ B + bias`` in one C call: numpy's own OpenBLAS ``sgemm`` (``attention.sgemm_address``)
into the output, then the bias added row by row in the same loop nest.

The linear layers of the tiny transformer exports (``[1, 128, 32] @ [32, 32] + [32]``) spent
6.7 us in ``np.matmul`` (3.4) then ``np.add`` (2.1: numpy's broadcast loop steps through 128
rows of 32) and the checks around them; the same sgemm and a C loop over the bias take 3.2.
The product is the one numpy computes (the same ``cblas_sgemm`` on the same rows), the sum
is one float32 addition per element as numpy's: the unfused results bit for bit.

Applies to float32 with A [..., M, K] (M >= 2), B [K, N] (N >= 2: numpy computes a
matrix-vector product through gemv, with other sums) and a bias of N values (shape ``(N,)`` or ones
before it), all C-contiguous, and an output that overlaps none of them (the C checks the
address ranges: a planned ``out`` never does, an arbitrary one is refused). ``linear``
returns None elsewhere (no compiler, no ILP64 OpenBLAS, other shapes or dtypes, an empty
product) and the caller runs numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.native import pool
from anychip.backends.cpu.native.attention import SGEMM_DECL, sgemm_address
from anychip.backends.cpu.native.pool import SOURCE_DECL
from anychip.backends.cpu.replay import record as _replay
from anychip.codegen.build import loader
from anychip.core.run.blas import blas_single
from anychip.errors import KernelError

__all__ = ["linear", "Bound", "bound", "gemm_columns", "into", "SPANS_DECL"]

#: What the products over one or more rows share (C, also ``gemv.py``'s): whether two float
#: ranges are apart (an output over an input is refused), and where block i of n outputs in
#: ``parts`` starts (multiples of 16, the last block to n).
SPANS_DECL = r"""
static int ac_apart(const float *p, long np_, const float *q, long nq) {
    return p + np_ <= q || q + nq <= p;
}
static long ac_block(long n, long parts, long i) {
    return i == parts ? n : (n * i / parts) & ~15L;
}
"""

_SOURCE = (
    SOURCE_DECL
    + SGEMM_DECL
    + SPANS_DECL
    + r"""

/* y = a @ b + bias (bias NULL: a @ b), or -1 (nothing written) where y overlaps an input. */
int ac_linear(long m, long n, long k, const float *a, const float *b, const float *bias,
              float *y, uintptr_t gemm) {
    if (!(ac_apart(y, m * n, a, m * k) && ac_apart(y, m * n, b, k * n) &&
          (!bias || ac_apart(y, m * n, bias, n))))
        return -1;
    ((ac_sgemm_t)gemm)(101, 111, 111, m, n, k, 1.0f, a, k, b, n, 0.0f, y, n);
    if (!bias) return 0; /* MatMul's product alone */
    for (long i = 0; i < m; i++) {
        float *yr = y + i * n;
        for (long j = 0; j < n; j++) yr[j] = yr[j] + bias[j];
    }
    return 0;
}

/* y = a @ op(b) by column blocks (multiples of 16 but the last), one sgemm each, on the
   pool's threads: op(b) is b [k, n] (tb 0) or b [n, k] transposed (tb 1). */
struct ac_cols { ac_sgemm_t g; long m, n, k, parts; int tb; const float *a, *b; float *y; };
static long ac_col(const struct ac_cols *s, long i) { return ac_block(s->n, s->parts, i); }
static void ac_cols_part(void *p, long i) {
    const struct ac_cols *s = (const struct ac_cols *)p;
    const long c0 = ac_col(s, i), c1 = ac_col(s, i + 1);
    if (c1 <= c0) return;
    const float *b = s->tb ? s->b + c0 * s->k : s->b + c0;
    s->g(101, 111, s->tb ? 112 : 111, s->m, c1 - c0, s->k, 1.0f, s->a, s->k, b,
         s->tb ? s->k : s->n, 0.0f, s->y + c0, s->n);
}
int ac_gemm_columns(long m, long n, long k, const float *a, const float *b, float *y,
                    uintptr_t gemm, int tb, long parts, int nthreads, uintptr_t pool) {
    if (!(ac_apart(y, m * n, a, m * k) && ac_apart(y, m * n, b, k * n))) return -1;
    struct ac_cols s = {(ac_sgemm_t)gemm, m, n, k, parts, tb, a, b, y};
    if (nthreads > 1 && pool) ((ac_pool_fn)pool)(ac_cols_part, &s, parts, nthreads);
    else for (long i = 0; i < parts; i++) ac_cols_part(&s, i);
    return 0;
}
"""
)
_CDEF = """int ac_linear(long m, long n, long k, const float *a, const float *b, const float *bias,
    float *y, uintptr_t gemm);
int ac_gemm_columns(long m, long n, long k, const float *a, const float *b, float *y,
    uintptr_t gemm, int tb, long parts, int nthreads, uintptr_t pool)"""
_F32 = np.dtype(np.float32)
_lib = loader(_SOURCE, _CDEF, "ac_linear")[0]


def into(out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    """``out`` when it is a C-contiguous float32 array of ``shape``, else a new one."""
    if out is None or out.shape != shape or out.dtype is not _F32 or not out.flags.c_contiguous:
        return _replay.empty(shape)  # np.empty, or a recorder's (backends/cpu/replay/record.py)
    return out


def linear(
    a: np.ndarray, b: np.ndarray, bias: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray | None:
    """``a @ b + bias`` into ``out`` when it is a C-contiguous float32 array of the result's
    shape, else into a new array; None where this path does not apply (module docstring)."""
    if not _applies(a, b, bias):
        return None
    gemm = sgemm_address()
    lib = _lib() if gemm else None
    if lib is None:
        return None
    k, n = b.shape
    out = into(out, a.shape[:-1] + (n,))
    ffi, c, f32 = lib
    buf = ffi.from_buffer
    y = buf(f32, out, require_writable=True)
    if c.ac_linear(a.size // k, n, k, buf(f32, a), buf(f32, b), buf(f32, bias), y, gemm) < 0:
        return None  # out overlaps an input: numpy's matmul copies for that
    return out


class Bound:
    """``linear`` for one node whose weights and bias stay the same arrays (constants): their
    pointers made once (``bound``), and a call checks only ``a`` and ``out``. The tiny BERT's
    ``[1, 128, 32] @ [32, 32] + [32]``: 6.1 us a call through ``linear``, 3.3 in C."""

    __slots__ = ("b", "bias", "shape", "out_shape", "m", "n", "k", "pb", "pc", "gemm", "fn")

    def __init__(
        self, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, lib: tuple, gemm: int
    ) -> None:
        ffi, c, f32 = lib
        self.b, self.bias, self.shape, self.gemm = b, bias, a.shape, gemm
        self.k, self.n = b.shape
        self.m = a.size // self.k
        self.out_shape = a.shape[:-1] + (self.n,)
        self.pb = ffi.from_buffer(f32, b)
        self.pc = ffi.NULL if bias is None else ffi.from_buffer(f32, bias)
        self.fn = (c.ac_linear, ffi.from_buffer, f32)

    def __call__(
        self, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, out: np.ndarray | None
    ) -> np.ndarray | None:
        """``a @ b + bias`` (no bias: ``a @ b``, numpy's product) as ``linear``; None where
        ``b``, ``bias`` or ``a``'s shape are not the bound ones (the caller runs its own
        path)."""
        if (
            b is not self.b
            or bias is not self.bias
            or a.shape != self.shape
            or a.dtype is not _F32
            or not a.flags.c_contiguous
        ):
            return None
        if (
            out is None
            or out.shape != self.out_shape
            or out.dtype is not _F32
            or not out.flags.c_contiguous
        ):
            out = _replay.empty(
                self.out_shape
            )  # np.empty, or a recorder's (backends/cpu/replay/record.py)
        run, buf, f32 = self.fn
        args = (self.m, self.n, self.k, buf(f32, a), self.pb, self.pc,
                buf(f32, out, require_writable=True), self.gemm)  # fmt: skip
        if run(*args) < 0:
            return None
        if _replay.ACTIVE:
            _replay.note(_checked, (run, args))
        return out


def _checked(run: Any, args: tuple) -> None:
    """A replayed ``Bound`` call (``cpu/replay/record.py``): its failure raised, not returned."""
    if run(*args) < 0:
        raise KernelError("the bound sgemm call failed on replay (its buffers could not be made)")


def bound(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> Bound | None:
    """A ``Bound`` for these arrays where ``linear`` applies to them (``bias`` None: the
    product alone, as numpy's matmul computes it), else None."""
    if not _applies(a, b, bias):
        return None
    gemm = sgemm_address()
    lib = _lib() if gemm else None
    return None if lib is None else Bound(a, b, bias, lib, gemm)


def _applies(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> bool:
    """The shapes, dtypes and layouts ``linear`` computes (module docstring)."""
    if not _f32_matrices(a, b):
        return False
    k, n = b.shape
    if a.shape[-1] != k:
        return False
    if bias is not None and not (
        bias.dtype is _F32
        and bias.flags.c_contiguous
        and bias.shape[-1:] == (n,)
        and bias.size == n
        and bias.ndim <= a.ndim
    ):
        return False
    # empty, zero-K, and matrix-vector products (numpy's gemv: other sums)
    return not (a.size == 0 or a.shape[-2] < 2 or n < 2 or k == 0)


def _f32_matrices(a: np.ndarray, b: np.ndarray) -> bool:
    """Float32 C-contiguous ``a [..., K]`` (rank 2 or more) and 2-D ``b``: what numpy's
    sgemm reads in place here."""
    return (
        a.dtype is _F32
        and b.dtype is _F32
        and b.ndim == 2
        and a.ndim >= 2
        and a.flags.c_contiguous
        and b.flags.c_contiguous
    )


def gemm_columns(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None, trans_b: bool, parts: int
) -> np.ndarray | None:
    """``a @ b`` (``a @ b.T`` with ``trans_b``) for float32 C-contiguous ``a [..., K]`` and 2-D
    ``b``, as ``parts`` column blocks of numpy's sgemm on the pool's threads (``parts`` of
    them), into ``out`` when it fits; None where this does not apply (no compiler, no ILP64
    OpenBLAS, OpenBLAS running more than one thread, an output over an input, other
    dtypes). Each element is the dot product the whole sgemm computes (numpy's own result
    where ``trans_b`` is false)."""
    if not _f32_matrices(a, b):
        return None
    n, k = b.shape if trans_b else b.shape[::-1]
    if a.shape[-1] != k or a.size == 0 or n < 16 * parts or k == 0:
        return None
    gemm = sgemm_address()
    lib = _lib() if gemm else None
    if lib is None or not blas_single():
        return None  # two threads calling a threaded OpenBLAS would each start its own
    shape = a.shape[:-1] + (n,)
    out = into(out, shape)
    ffi, c, f32 = lib
    buf = ffi.from_buffer
    args = (
        a.size // k, n, k, buf(f32, a), buf(f32, b), buf(f32, out, require_writable=True),
        gemm, int(trans_b), parts, parts, pool.address(),
    )  # fmt: skip
    if c.ac_gemm_columns(*args) < 0:
        return None
    if _replay.ACTIVE:  # the one call: all the product does (``split_columns``' callers)
        _replay.note(_checked, (c.ac_gemm_columns, args))
        _replay.seal()
    return out
