"""The host C emitter: one function per kernel, a loop gcc vectorizes at ``-O3``.

No ``-ffast-math`` (``codegen/build.py``), so NaN, infinities, signed zeros and denormals keep
IEEE semantics. gcc vectorizes glibc's ``expf`` only under fast-math, so float32 ``exp``,
``sigmoid`` and ``tanh`` call the inline ``ac_expf``/``ac_tanhf`` below instead: Cephes'
range reduction and polynomials (about 1 ulp) written as branch-free selects that gcc turns
into vector blends, with NaN, overflow to +inf, underflow through the denormals to 0 and
+-inf handled explicitly; float32 ``erf`` is the CPU Erf kernel's formula over ``ac_expf``.
``log`` and ``pow`` stay glibc's (exact, scalar; ``pow(x, 0.5)`` a sqrt written out with
pow's values at -inf and -0); float64 uses glibc throughout.
"""

from __future__ import annotations

from anychip.codegen.emitter import Emitter
from anychip.codegen.program import KernelSpec

__all__ = ["CEmitter", "C_PRELUDE", "POOL_ABI"]

#: The calling convention between a generated kernel and the host runtime that runs its chunks
#: on threads: the kernel receives ``nthreads`` and a ``pool`` entry point of type
#: ``ac_pool_fn``. The runtime (the CPU backend's thread pool) implements it; the emitter only
#: declares it, so code generation imports no runtime.
POOL_ABI = r"""
#include <stdint.h>
typedef void (*ac_chunk_fn)(void *ctx, long chunk);
typedef void (*ac_pool_fn)(ac_chunk_fn fn, void *ctx, long chunks, int threads);
"""

C_PRELUDE = r"""
#include <math.h>
#include <string.h>
#include <stdint.h>

static inline float ac_bits(int32_t i) { float f; memcpy(&f, &i, 4); return f; }

/* pow with C99's values everywhere: gcc takes pow(x, 0.5) as sqrt in the vector loop only
   (-inf gives NaN and -0 gives -0 there, +inf and +0 in the scalar tail), so a half exponent
   is a sqrt written out, with pow's +inf for -inf and +0 for -0 (-0 + 0 is +0). */
static inline float ac_powf(float x, float y) {
    if (y == 0.5f) { float s = sqrtf(x) + 0.0f; return x == -INFINITY ? INFINITY : s; }
    return powf(x, y);
}
static inline double ac_pow(double x, double y) {
    if (y == 0.5) { double s = sqrt(x) + 0.0; return x == -INFINITY ? INFINITY : s; }
    return pow(x, y);
}

/* a * b + c in one rounding where the CPU has FMA (one instruction for two), else as
   written: in exp's and tanh's polynomials only (the tiny BERT's GELU over 8192 floats 13.4
   -> 12.7 us a call); ``-ffp-contract=off`` keeps the generated chains rounded as numpy's. */
#ifdef __FMA__
#define AC_FMA(a, b, c) __builtin_fmaf(a, b, c)
#else
#define AC_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* exp's Cephes core for a clamped, non-NaN xc: xc = n ln2 + r, |r| <= ln2/2; returns
   exp(r) and stores n (ac_expf's, ac_expf_le0's and ac_tanhf's). */
static inline float ac_expf_core(float xc, float *pn) {
    float n = floorf(AC_FMA(xc, 1.44269504088896341f, 0.5f));
    float r = AC_FMA(n, -0.693359375f, xc);
    r = AC_FMA(n, 2.12194440e-4f, r);
    float z = r * r;
    float p = 1.9875691500e-4f;
    p = AC_FMA(p, r, 1.3981999507e-3f);
    p = AC_FMA(p, r, 8.3334519073e-3f);
    p = AC_FMA(p, r, 4.1665795894e-2f);
    p = AC_FMA(p, r, 1.6666665459e-1f);
    p = AC_FMA(p, r, 5.0000001201e-1f);
    *pn = n;
    return AC_FMA(p, z, r) + 1.0f;
}

/* exp of an x at most 0 or -inf, not NaN (a softmax's x - max over a row whose maximum is
   finite), so no overflow branch: ac_expf_core with the multiply-adds fused where the CPU has
   FMA (within 1.4 ulp of exp; 13 us for the tiny BERT's 32768 scores against ac_expf's 21). */
static inline float ac_expf_fin(float x) {
    float n;
    float e = ac_expf_core(x < -104.0f ? -104.0f : x, &n);
    /* 2^n for n in [-150, 0] as 2^(n + 64), exact in the normal range, then 2^-64, the one
       rounding (into the denormals when n < -126): ac_expf's two halves of n give the same
       bits (all of [-110, 0] compared) with four operations fewer. */
    e = e * ac_bits(((int32_t)n + 191) << 23) * 0x1p-64f;
    return x < -103.97208404541015625f ? 0.0f : e;
}

/* ac_expf_fin where x may also be NaN (erf's -x^2, any softmax row): NaN gives NaN. */
static inline float ac_expf_le0(float x) {
    return x != x ? x : ac_expf_fin(x != x ? 0.0f : x);
}

/* exp for float32: 2^n applied as two factors so results in the denormal range round
   once. */
static inline float ac_expf(float x) {
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    xc = xc != xc ? 0.0f : xc;
    float n;
    float e = ac_expf_core(xc, &n);
    int32_t ni = (int32_t)n;
    int32_t n1 = ni >> 1;
    int32_t n2 = ni - n1;
    e = e * ac_bits((n1 + 127) << 23) * ac_bits((n2 + 127) << 23);
    e = x > 88.72283935546875f ? INFINITY : e;
    e = x < -103.97208404541015625f ? 0.0f : e;
    return x != x ? x : e;
}

/* tanh for float32: Cephes' odd polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above, with
   |x| clamped to 9.1 there (tanh rounds to 1 from 8.7 on), so exp's argument stays in
   [1.25, 18.2] and needs one power-of-two factor and no overflow, underflow or NaN cases
   (the same bits as before for all 2^32 inputs; 16384 floats 14.5 -> 10.1 us). */
static inline float ac_tanhf(float x) {
    float a = x < 0.0f ? -x : x;
    float z = x * x;
    float s = -5.70498872745e-3f;
    s = AC_FMA(s, z, 2.06390887954e-2f);
    s = AC_FMA(s, z, -5.37397155531e-2f);
    s = AC_FMA(s, z, 1.33314422036e-1f);
    s = AC_FMA(s, z, -3.33332819422e-1f);
    s = AC_FMA(s * z, x, x);
    float ac = a > 9.1f ? 9.1f : a;
    ac = ac != ac ? 0.0f : ac;
    float n;
    float e = ac_expf_core(2.0f * ac, &n);
    e = e * ac_bits(((int32_t)n + 127) << 23);
    float big = 1.0f - 2.0f / (e + 1.0f);
    float r = a < 0.625f ? s : big;
    return x != x ? x : __builtin_copysignf(r, x); /* odd: -0 stays -0 (the sum gave +0) */
}

/* erf for float32: Abramowitz & Stegun 7.1.26 (absolute error 1.5e-7), the formula of the
   CPU's Erf kernel, so a fused chain computes what the unfused one does: its own steps
   unfused (fused multiply-adds moved the result up to 5.6e-7 from the Erf kernel's near
   0, where 1 - p * exp(-x^2) cancels). Its exp of -x^2 goes through ac_expf_le0: the same
   bits as ac_expf (all 2^32 inputs compared), 16384 floats 14.8 -> 12.2 us. */
static inline float ac_erff(float x) {
    float s = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x);
    float a = x < 0.0f ? -x : x;
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float p = 1.061405429f;
    p = -1.453152027f + t * p;
    p = 1.421413741f + t * p;
    p = -0.284496736f + t * p;
    p = 0.254829592f + t * p;
    p = t * p;
    return s * (1.0f - p * ac_expf_le0(-a * a));
}
"""


class CEmitter(Emitter):
    """C99 for gcc/clang: ``void anychip_fused(long outer, long inner, const T *in0, ...,
    long m<k> (R inputs), T *out, int nthreads, uintptr_t pool)``."""

    name = "c"

    def unary(self, op: str, a: str, ctype: str) -> str:
        if ctype == "float" and op in ("exp", "tanh", "sigmoid", "erf"):
            return {
                "exp": f"ac_expf({a})",
                "tanh": f"ac_tanhf({a})",
                "erf": f"ac_erff({a})",
                "sigmoid": f"(1.0f / (1.0f + ac_expf(-{a})))",
            }[op]
        return super().unary(op, a, ctype)

    def binary(self, op: str, a: str, b: str, ctype: str) -> str:
        if op == "pow":
            return f"ac_pow{self.suffix(ctype)}({a}, {b})"
        return super().binary(op, a, b, ctype)

    def signature(self, spec: KernelSpec) -> str:
        """The C declaration (also cffi's ``cdef``)."""
        ctype = self.ctypes[spec.dtype]
        params = ["long outer", "long inner"]
        params += [f"const {ctype} *in{k}" for k in range(len(spec.classes))]
        params += [f"long m{k}" for k, c in enumerate(spec.classes) if c == "R"]
        params += [f"{ctype} *out", "int nthreads", "uintptr_t pool"]
        return f"void {spec.name}({', '.join(params)})"

    def source(self, spec: KernelSpec) -> str:
        """``ac_range`` computes the flat output elements ``[start, end)`` row piece by row
        piece; the kernel runs it once, or, given ``nthreads`` and the pool's entry point
        (passed in as ``runtime_decl``), over about eight chunks per thread (multiples of 16
        elements:
        whole cache lines) that the caller and the pool's threads take as they come free."""
        ctype = self.ctypes[spec.dtype]
        n = len(spec.classes)
        mods = [f"m{k}" for k, c in enumerate(spec.classes) if c == "R"]
        names = [f"in{k}" for k in range(n)] + mods
        fields = [f"const {ctype} *in{k};" for k in range(n)] + [f"long {m};" for m in mods]
        lines = [C_PRELUDE, POOL_ABI]
        lines += self._range(spec, mods)
        lines += [
            "struct ac_args { long total, inner, chunk; "
            + " ".join(fields)
            + f" {ctype} *out; }};",
            "static void ac_chunk(void *p, long c) {",
            "    const struct ac_args *a = (const struct ac_args *)p;",
            "    const long s = c * a->chunk;",
            "    const long e = s + a->chunk < a->total ? s + a->chunk : a->total;",
            f"    ac_range(s, e, a->inner, {', '.join('a->' + x for x in names)}, a->out);",
            "}",
            "",
            self.signature(spec) + " {",
            "    const long total = outer * inner;",
            "    if (nthreads > 1 && pool) {",
            "        long chunk = total / (8 * (long)nthreads);",
            "        chunk = chunk < 4096 ? 4096 : chunk - chunk % 16;",
            f"        struct ac_args a = {{total, inner, chunk, {', '.join(names)}, out}};",
            "        ((ac_pool_fn)pool)(ac_chunk, &a, (total + chunk - 1) / chunk, nthreads);",
            "        return;",
            "    }",
            f"    ac_range(0, total, inner, {', '.join(names)}, out);",
            "}",
            "",
        ]
        return "\n".join(lines)

    def _range(self, spec: KernelSpec, mods: list[str]) -> list[str]:
        ctype = self.ctypes[spec.dtype]
        # restrict on every input but the first: the output may be in0's own memory (the
        # planner's in-place hint); gcc then versions the loop and runs it vectorized anyway
        ins = [f"const {ctype} *{'restrict ' if k else ''}in{k}" for k in range(len(spec.classes))]
        params = ["long start", "long end", "long inner", *ins, *[f"long {m}" for m in mods]]
        lines = [f"static void ac_range({', '.join(params)}, {ctype} *y) {{"]
        for k, c in enumerate(spec.classes):
            if c == "S":
                lines.append(f"    const {ctype} s{k} = in{k}[0];")
        lines += [
            "    long o = start / inner, i0 = start - o * inner;",
            "    for (long pos = start; pos < end; o++, i0 = 0) {",
            "        const long i1 = end - pos < inner - i0 ? i0 + (end - pos) : inner;",
            "        const long base = o * inner;",
        ]
        for k, c in enumerate(spec.classes):
            if c == "R":
                lines.append(f"        const {ctype} r{k} = in{k}[o % m{k}];")
        lines.append("        for (long i = i0; i < i1; i++) {")
        body = self.body(spec, " " * 12)
        lines += body
        lines.append(f"            y[base + i] = t{len(body) - 1};")
        return lines + ["        }", "        pos += i1 - i0;", "    }", "}", ""]
