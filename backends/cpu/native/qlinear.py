"""8-bit products and their requantization in one C call: ``QLinearMatMul``, ``QGemm``,
``MatMulInteger`` and ``DequantMatMul`` (the QDQ fusion), and the element-wise quantized ops
around them (``QuantizeLinear``, ``DequantizeLinear``, ``DynamicQuantizeLinear``,
``QLinearAdd``, ``QLinearMul``), per tensor, from generated C (``codegen/build.py``).

Why: the quantized models people run are small (a 16 x 32 MLP), where numpy's path spent
about 50 us per product on scalar arithmetic of scales and zero points, and oneDNN's int8
primitive about as much in its fixed cost (decision 053 has the figures). Here a product
``(A - za) @ (B - zb)`` is summed exactly in 32-bit integers (wrapping modulo 2**32 where the
true sum leaves int32, as ONNX allows) from weights centered once per node into int16
(``centered``), and each row's sums are requantized while still in cache.

Numerics are those of the numpy kernels they replace, operation for operation (IEEE float32
or float64 as noted per mode, ``-ffp-contract=off``, ``nearbyint`` in the default rounding
mode: half to even), so a C call and the numpy path give the same bits; the tests check that.

Modes of ``ac_qmm`` (``acc`` the exact integer sum, ``c`` an int32 bias per column):

* 0, int32: ``acc`` (``MatMulInteger``);
* 1, float32: ``f32(acc + c) * scale[j] (+ bias[j])`` (``QGemm`` without ``y_scale``,
  ``DequantMatMul``);
* 2, 8-bit through float32: ``clip(rint(f32(acc + c) * scale[j] / ys) + yzp)`` (``QGemm``);
* 3, 8-bit through float64: ``clip(rint(f64(acc) * f64(scale[j]) / ys) + yzp)``
  (``QLinearMatMul``).

Every function returns None where it does not apply (no compiler, ``ANYCHIP_NATIVE=0``,
other dtypes or forms) and the caller keeps its numpy path.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from anychip.codegen.build import loader

__all__ = [
    "available",
    "centered",
    "Product",
    "quantize",
    "dequantize",
    "dynamic_quantize",
    "qbinary",
    "MAX_K",
]

#: The longest reduction summed here: beyond it a product belongs to oneDNN anyway, and
#: four int16 products summed before the wrapping add stay far inside int32.
MAX_K = 1 << 16

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <math.h>

static inline int32_t ac_ld(const uint8_t *a, long i, int sgn) {
    return sgn ? (int32_t)(int8_t)a[i] : (int32_t)a[i];
}

static inline double ac_clamp(double q, double lo, double hi) {
    return q < lo ? lo : (q > hi ? hi : q);
}

/* acc[0:n] = sum_t (a[t] - za) * bc[t, 0:n], wrapping modulo 2**32. */
static void ac_q_row(const uint8_t *a, int sgn, int32_t za, long k, long n,
                     const int16_t *bc, uint32_t *acc) {
    for (long j = 0; j < n; j++) acc[j] = 0;
    long t = 0;
    for (; t + 4 <= k; t += 4) {
        const int32_t a0 = ac_ld(a, t, sgn) - za, a1 = ac_ld(a, t + 1, sgn) - za;
        const int32_t a2 = ac_ld(a, t + 2, sgn) - za, a3 = ac_ld(a, t + 3, sgn) - za;
        const int16_t *b0 = bc + t * n, *b1 = b0 + n, *b2 = b1 + n, *b3 = b2 + n;
        for (long j = 0; j < n; j++)
            acc[j] += (uint32_t)(a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]);
    }
    for (; t < k; t++) {
        const int32_t av = ac_ld(a, t, sgn) - za;
        const int16_t *br = bc + t * n;
        for (long j = 0; j < n; j++) acc[j] += (uint32_t)(av * br[j]);
    }
}

int ac_qmm(long m, long k, long n, const uint8_t *a, int a_sgn, const int32_t *za,
           int za_rows, const int16_t *bc, const int32_t *raw, const int32_t *c,
           int mode, const float *scale, int scale_cols, const float *bias, double ys,
           double yzp, double lo, double hi, void *out) {
    uint32_t *acc = raw ? NULL : (uint32_t *)malloc(sizeof(uint32_t) * (n > 0 ? n : 1));
    if (!raw && !acc) return -1;
    for (long i = 0; i < m; i++) {
        const uint32_t *r;
        if (raw) {
            r = (const uint32_t *)(raw + i * n);
        } else {
            ac_q_row(a + i * k, a_sgn, za[za_rows ? i : 0], k, n, bc, acc);
            r = acc;
        }
        if (mode == 0) {
            int32_t *y = (int32_t *)out + i * n;
            for (long j = 0; j < n; j++) y[j] = (int32_t)(r[j] + (c ? (uint32_t)c[j] : 0u));
        } else if (mode == 1) {
            float *y = (float *)out + i * n;
            for (long j = 0; j < n; j++) {
                float v = (float)(int32_t)(r[j] + (c ? (uint32_t)c[j] : 0u));
                v = v * scale[scale_cols ? j : 0];
                y[j] = bias ? v + bias[j] : v;
            }
        } else if (mode == 2) {
            uint8_t *y = (uint8_t *)out + i * n;
            const float fys = (float)ys, fzp = (float)yzp;
            for (long j = 0; j < n; j++) {
                float v = (float)(int32_t)(r[j] + (c ? (uint32_t)c[j] : 0u));
                v = v * scale[scale_cols ? j : 0];
                float q = nearbyintf(v / fys) + fzp;
                q = q < (float)lo ? (float)lo : (q > (float)hi ? (float)hi : q);
                y[j] = (uint8_t)(int32_t)q;
            }
        } else {
            uint8_t *y = (uint8_t *)out + i * n;
            for (long j = 0; j < n; j++) {
                double v = (double)(int32_t)r[j] * (double)scale[scale_cols ? j : 0];
                y[j] = (uint8_t)(int32_t)ac_clamp(nearbyint(v / ys) + yzp, lo, hi);
            }
        }
    }
    free(acc);
    return 0;
}

/* QuantizeLinear per tensor, float32: clip(rint(x / s) + zp). NaN gives -1 (numpy's path). */
int ac_quant(long count, const float *x, float s, float zp, float lo, float hi, uint8_t *y) {
    int bad = 0;
    for (long i = 0; i < count; i++) {
        float q = nearbyintf(x[i] / s) + zp;
        bad |= q != q;
        q = q < lo ? lo : (q > hi ? hi : q);
        y[i] = (uint8_t)(int32_t)q;
    }
    return bad ? -1 : 0;
}

/* DequantizeLinear per tensor to float32: (x - zp) * s. */
void ac_dequant(long count, const uint8_t *x, int sgn, float zp, float s, float *y) {
    for (long i = 0; i < count; i++) y[i] = ((float)ac_ld(x, i, sgn) - zp) * s;
}

/* DynamicQuantizeLinear: range, scale and zero point in float32 as the spec's formula; -1
   where the input holds a NaN (numpy's path says what happens then). */
int ac_dynq(long count, const float *x, uint8_t *y, float *scale, uint8_t *zp) {
    float lo = 0.0f, hi = 0.0f;
    int bad = 0;
    for (long i = 0; i < count; i++) {
        const float v = x[i];
        bad |= v != v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    if (bad) return -1;
    const float s = (hi - lo) / 255.0f;
    *scale = s;
    if (s == 0.0f) {
        *zp = 0;
        for (long i = 0; i < count; i++) y[i] = 0;
        return 0;
    }
    float z = 0.0f - lo / s;
    z = nearbyintf(z < 0.0f ? 0.0f : (z > 255.0f ? 255.0f : z));
    *zp = (uint8_t)(int32_t)z;
    for (long i = 0; i < count; i++) {
        float q = nearbyintf(x[i] / s) + z;
        q = q < 0.0f ? 0.0f : (q > 255.0f ? 255.0f : q);
        y[i] = (uint8_t)(int32_t)q;
    }
    return 0;
}

/* QLinearAdd (op 0) / QLinearMul (op 1): b repeats every nb elements of a (nb divides n). */
void ac_qbin(int op, long n, const uint8_t *a, int a_sgn, float sa, float za, long nb,
             const uint8_t *b, int b_sgn, float sb, float zb, float sc, float zc, float lo,
             float hi, uint8_t *y) {
    for (long i = 0; i < n; i++) {
        const float u = ((float)ac_ld(a, i, a_sgn) - za) * sa;
        const float v = ((float)ac_ld(b, i % nb, b_sgn) - zb) * sb;
        float q = nearbyintf((op ? u * v : u + v) / sc) + zc;
        q = q < lo ? lo : (q > hi ? hi : q);
        y[i] = (uint8_t)(int32_t)q;
    }
}
"""
_CDEF = """
int ac_qmm(long m, long k, long n, const uint8_t *a, int a_sgn, const int32_t *za,
    int za_rows, const int16_t *bc, const int32_t *raw, const int32_t *c, int mode,
    const float *scale, int scale_cols, const float *bias, double ys, double yzp, double lo,
    double hi, void *out);
int ac_quant(long count, const float *x, float s, float zp, float lo, float hi, uint8_t *y);
void ac_dequant(long count, const uint8_t *x, int sgn, float zp, float s, float *y);
int ac_dynq(long count, const float *x, uint8_t *y, float *scale, uint8_t *zp);
void ac_qbin(int op, long n, const uint8_t *a, int a_sgn, float sa, float za, long nb,
    const uint8_t *b, int b_sgn, float sb, float zb, float sc, float zc, float lo, float hi,
    uint8_t *y);
"""
_lib, forget = loader(_SOURCE, _CDEF, "ac_qmm")
_U8, _S8 = np.dtype(np.uint8), np.dtype(np.int8)
_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)
_RANGE = {_U8: (0.0, 255.0), _S8: (-128.0, 127.0)}
_ZERO = np.zeros(1, _I32)


def _get() -> Any | None:
    if os.environ.get("ANYCHIP_NATIVE", "1") == "0":
        return None
    return _lib()


def available() -> bool:
    """Whether the C here is built (a compiler, ``ANYCHIP_NATIVE`` not 0)."""
    return _get() is not None


def _one(v: np.ndarray | None) -> bool:
    return v is None or np.asarray(v).size == 1


def _is8(a: np.ndarray) -> bool:
    return a.dtype in _RANGE


def _ptr(ffi: Any, a: np.ndarray, kind: str = "uint8_t[]", write: bool = False) -> Any:
    return ffi.from_buffer(kind, a, require_writable=write)


def centered(b: np.ndarray, zb: np.ndarray | None, trans_b: bool = False) -> np.ndarray | None:
    """``b - zb`` (``b.T - zb`` with ``trans_b``) as C-contiguous int16 ``[K, N]``, ``zb``
    common or per column; None for other forms (8-bit 2-D ``b`` only)."""
    if not _is8(b) or b.ndim != 2:
        return None
    w = (b.T if trans_b else b).astype(np.int16)
    n = w.shape[1]
    if zb is not None:
        z = np.asarray(zb)
        if z.dtype.kind not in "iu" or z.size not in (1, n):
            return None
        w -= z.astype(np.int16).reshape(1, -1) if z.size == n else z.astype(np.int16).reshape(())
    return np.ascontiguousarray(w)


class Product:
    """The product of 8-bit ``a [..., M, K]`` by centered weights ``bc [K, N]``
    (``centered``), or by a given exact int32 product ``raw [M', N]`` (oneDNN's, for large
    sizes), with the epilogue of ``mode`` (module docstring): ``scale`` float32 ``[N]`` or
    one value, ``c`` int32 ``[N]``, ``bias`` float32 ``[N]``, 8-bit results of ``out_dtype``.

    Made once per node while its constants stay the same (kernels keep it), so a call
    converts nothing but ``a`` and its zero point: about 2 us of Python around the C.
    """

    __slots__ = ("n", "k", "mode", "dtype", "keep", "args", "lib")

    def __init__(
        self,
        bc: np.ndarray | None,
        n: int,
        mode: int,
        *,
        scale: np.ndarray | float | None = None,
        c: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        ys: float = 1.0,
        yzp: np.ndarray | None = None,
        out_dtype: np.dtype | None = None,
    ) -> None:
        self.lib = lib = _get()
        self.n, self.mode, self.k = n, mode, -1 if bc is None else bc.shape[0]
        self.dtype = {0: _I32, 1: _F32}.get(mode, np.dtype(out_dtype or _U8))
        sc = np.ones(1, _F32) if scale is None else np.ascontiguousarray(scale, _F32).reshape(-1)
        if bias is not None:
            bias = np.ascontiguousarray(bias, _F32).reshape(-1)
        if c is not None:
            c = np.ascontiguousarray(c, _I32).reshape(-1)
        ok = lib is not None and sc.size in (1, n) and self.dtype in (_I32, _F32, *_RANGE)
        ok = ok and (c is None or c.size == n) and (bias is None or bias.size == n)
        ok = ok and (bc is None or (bc.dtype == np.int16 and bc.shape[1] == n))
        if not ok:
            self.lib = None
            return
        ffi = lib[0]
        self.keep = (bc, sc, c, bias)  # the arrays the pointers below point into
        lo, hi = _RANGE.get(self.dtype, (0.0, 0.0))
        z = 0.0 if yzp is None else float(np.asarray(yzp).reshape(-1)[0])
        self.args = (
            ffi.NULL if bc is None else _ptr(ffi, bc, "int16_t[]"),
            ffi.NULL if c is None else _ptr(ffi, c, "int32_t[]"),
            _ptr(ffi, sc, "float[]"), int(sc.size > 1),
            ffi.NULL if bias is None else _ptr(ffi, bias, "float[]"), float(ys), z, lo, hi,
        )  # fmt: skip

    def __call__(
        self, a: np.ndarray, za: np.ndarray | None, raw: np.ndarray | None = None
    ) -> np.ndarray | None:
        """The result for ``a`` (zero point ``za``: one value or one per row), or None."""
        lib = self.lib
        if lib is None or a.dtype not in _RANGE or a.ndim < 2:
            return None
        k, n = a.shape[-1], self.n
        m = a.size // k if k else 0
        if m == 0 or k == 0 or (raw is None and (k != self.k or k > MAX_K)):
            return None
        if raw is not None and (raw.dtype != _I32 or raw.shape[-1] != n or raw.size != m * n):
            return None
        za_arr = _ZERO if za is None else np.asarray(za).astype(_I32).reshape(-1)
        if za_arr.size not in (1, m):
            return None
        ffi, c_lib, _ = lib
        bc, c, sc, cols, bias, ys, yzp, lo, hi = self.args
        out = np.empty(a.shape[:-1] + (n,), self.dtype)
        done = c_lib.ac_qmm(
            m, k, n, _ptr(ffi, np.ascontiguousarray(a)), int(a.dtype == _S8),
            _ptr(ffi, za_arr, "int32_t[]"), int(za_arr.size > 1),
            bc if raw is None else ffi.NULL,
            ffi.NULL if raw is None else _ptr(ffi, np.ascontiguousarray(raw), "int32_t[]"),
            c, self.mode, sc, cols, bias, ys, yzp, lo, hi, _ptr(ffi, out, write=True),
        )  # fmt: skip
        return None if done < 0 else out


def quantize(x: np.ndarray, s: np.ndarray, zp: np.ndarray | None) -> np.ndarray | None:
    """``QuantizeLinear`` of float32 ``x`` per tensor (one float32 scale, an 8-bit zero point
    or none: uint8); None elsewhere or where ``x`` holds a NaN."""
    lib = _get()
    if lib is None or x.dtype is not _F32 or np.asarray(s).dtype != _F32 or not _one(s):
        return None
    dt = _U8 if zp is None else np.asarray(zp).dtype
    if dt not in _RANGE or not _one(zp):
        return None
    ffi, c_lib, _ = lib
    xc = np.ascontiguousarray(x)
    out = np.empty(x.shape, dt)
    lo, hi = _RANGE[dt]
    z = 0.0 if zp is None else float(np.asarray(zp).reshape(-1)[0])
    s1 = float(np.asarray(s).reshape(-1)[0])
    if c_lib.ac_quant(xc.size, _ptr(ffi, xc, "float[]"), s1, z, lo, hi, _ptr(ffi, out, write=True)):
        return None
    return out


def dequantize(x: np.ndarray, s: np.ndarray, zp: np.ndarray | None) -> np.ndarray | None:
    """``DequantizeLinear`` of 8-bit ``x`` per tensor to float32; None for other forms."""
    lib = _get()
    if lib is None or not _is8(x) or np.asarray(s).dtype != _F32 or not (_one(s) and _one(zp)):
        return None
    ffi, c_lib, _ = lib
    xc = np.ascontiguousarray(x)
    out = np.empty(x.shape, _F32)
    z = 0.0 if zp is None else float(np.asarray(zp).reshape(-1)[0])
    s1 = float(np.asarray(s).reshape(-1)[0])
    y = _ptr(ffi, out, "float[]", True)
    c_lib.ac_dequant(xc.size, _ptr(ffi, xc), int(x.dtype == _S8), z, s1, y)
    return out


def dynamic_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``DynamicQuantizeLinear`` of float32 ``x``; None elsewhere or where ``x`` holds a NaN."""
    lib = _get()
    if lib is None or x.dtype is not _F32:
        return None
    ffi, c_lib, _ = lib
    xc = np.ascontiguousarray(x)
    y = np.empty(x.shape, _U8)
    scale, zp = np.zeros((), _F32), np.zeros((), _U8)
    done = c_lib.ac_dynq(
        xc.size, _ptr(ffi, xc, "float[]"), _ptr(ffi, y, write=True),
        _ptr(ffi, scale, "float[]", True), _ptr(ffi, zp, write=True),
    )  # fmt: skip
    return None if done else (y, scale, zp)


def qbinary(
    op: int,
    a: np.ndarray,
    sa: np.ndarray,
    za: np.ndarray | None,
    b: np.ndarray,
    sb: np.ndarray,
    zb: np.ndarray | None,
    sc: np.ndarray,
    zc: np.ndarray | None,
) -> np.ndarray | None:
    """``QLinearAdd`` (op 0) or ``QLinearMul`` (op 1) per tensor, where one input's shape is
    the other's trailing dimensions (a bias, one value, the same shape); None elsewhere."""
    lib = _get()
    if lib is None or not (_is8(a) and _is8(b)):
        return None
    if not all(_one(p) for p in (sa, za, sb, zb, sc, zc)):
        return None
    if any(np.asarray(p).dtype != _F32 for p in (sa, sb, sc)):
        return None
    dt = a.dtype if zc is None else np.asarray(zc).dtype  # the first input's without one
    if dt not in _RANGE:
        return None
    if a.size < b.size:  # the bigger one first: + and * are commutative in IEEE arithmetic
        a, sa, za, b, sb, zb = b, sb, zb, a, sa, za
    tail = tuple(b.shape[_lead_ones(b.shape) :])
    if b.size != 1 and (len(tail) > a.ndim or a.shape[a.ndim - len(tail) :] != tail):
        return None
    shape = np.broadcast_shapes(a.shape, b.shape)
    if shape != a.shape or b.size == 0:
        return None
    ffi, c_lib, _ = lib
    ac, bc = np.ascontiguousarray(a), np.ascontiguousarray(b)
    out = np.empty(shape, dt)
    lo, hi = _RANGE[dt]

    def f(v: np.ndarray | None) -> float:
        return 0.0 if v is None else float(np.asarray(v).reshape(-1)[0])

    c_lib.ac_qbin(
        op, ac.size, _ptr(ffi, ac), int(a.dtype == _S8), f(sa), f(za), bc.size, _ptr(ffi, bc),
        int(b.dtype == _S8), f(sb), f(zb), f(sc), f(zc), lo, hi, _ptr(ffi, out, write=True),
    )  # fmt: skip
    return out


def _lead_ones(shape: tuple[int, ...]) -> int:
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return i
