"""onnxruntime's float32 log-softmax (MLAS ``MlasComputeSoftmax``) to the bit, where it can be.

BeamSearch sums log-probabilities over many steps and then orders hypotheses by them, so a
one-ulp difference in one log-softmax can swap two hypotheses that onnxruntime scores equal
(decision 056). MLAS computes ``(x - max) - logf(sum(exp(x - max)))`` with its own vectorized
exp (a two-constant range reduction, a degree-6 polynomial, a ``2^m`` scale) and summation
order, in a kernel chosen by the CPU, as onnxruntime's x86-64 build picks it:

- AVX-512F (``MlasComputeSumExpF32KernelAvx512F``): fused multiply-adds, clamp at -103.97,
  ``vscalefps``; 16 lanes, 48 elements a round then 16 at a time (masked), lanes reduced
  ``(8 + 8) -> pairs -> quads -> halves``. Checked to the bit against onnxruntime here.
- AVX2 with FMA (``...KernelFma3``): fused multiply-adds, clamp at -88.38, the scale built in
  the exponent field; 8 lanes, 24 a round then 8 at a time, the same tree from 8 lanes.
- otherwise (``MlasComputeSumExpF32Kernel``, SSE2): separate multiply and add, 4 lanes, reduced
  ``(0 + 2) + (1 + 3)``, then the last ``D % 4`` elements added one by one.

The last two are read from MLAS's source and not checked against onnxruntime (no such CPU
here). A fused multiply-add is a float64 product and sum rounded to float32, which
double-rounds in rare cases. Where ``/proc/cpuinfo`` or the C library's ``logf`` is missing,
or on another architecture, numpy's log-softmax is used, within an ulp of onnxruntime.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
from collections.abc import Callable

import numpy as np

from anychip.backends.cpu.features import cpu_flags

__all__ = ["log_softmax", "powf"]

_F32 = np.float32
_LOWER_RANGE = _F32(-103.9720840454)
_LOWER_RANGE_SUM_EXP = _F32(-88.3762626647949)
_BIAS = _F32(12582912.0)
_LOG2_RECIPROCAL = _F32(1.44269504088896341)
_LOG2_HIGH = _F32(-6.93145752e-1)
_LOG2_LOW = _F32(-1.42860677e-6)
_POLY = [
    _F32(float.fromhex(c))
    for c in ("0x1.694000p-10", "0x1.125edcp-7", "0x1.555b5ap-5", "0x1.555450p-3")
    + ("0x1.fffff6p-2", "0x1.000000p+0", "0x1.000000p+0")
]


def _kernel() -> str:
    """The sum-exp kernel onnxruntime picks on this CPU, or "" where none is reproduced."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ""
    flags = cpu_flags()
    if "avx512f" in flags:
        return "avx512f"
    if "avx2" in flags and "fma" in flags:
        return "fma3"
    return "sse2" if flags else ""


@functools.lru_cache(maxsize=2)
def _libm(name: str, arity: int) -> Callable[..., float] | None:
    """The C library's float function ``name`` (``logf``, ``powf``), which onnxruntime's
    compiled code calls, or None."""
    path = ctypes.util.find_library("m")
    if path is None:
        return None
    try:
        fn = getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float] * arity
    return fn  # type: ignore[no-any-return]


def _logf() -> Callable[..., float] | None:
    return _libm("logf", 1)


def powf(x: float, y: float) -> np.float32:
    """C's ``powf(x, y)`` (BeamSearch's length penalty); numpy's float32 power differs from
    glibc's in about 20% of cases."""
    fn = _libm("powf", 2)
    if fn is None:
        return np.float32(np.power(np.float64(x), np.float64(y)))
    return np.float32(fn(float(x), float(y)))


def _fma(a: np.ndarray, b: np.ndarray | np.float32, c: np.ndarray | np.float32) -> np.ndarray:
    return (np.asarray(a, np.float64) * np.float64(b) + np.asarray(c, np.float64)).astype(_F32)


def _mul_add(a: np.ndarray, b: np.ndarray | np.float32, c: np.ndarray | np.float32) -> np.ndarray:
    return ((np.asarray(a, _F32) * _F32(b)).astype(_F32) + np.asarray(c, _F32)).astype(_F32)


def _exp(x: np.ndarray, kernel: str) -> np.ndarray:
    """MLAS's exp of ``x`` (already shifted by the row maximum) in ``kernel``'s arithmetic."""
    mad = _mul_add if kernel == "sse2" else _fma
    x = np.maximum(_LOWER_RANGE if kernel == "avx512f" else _LOWER_RANGE_SUM_EXP, x)
    biased = mad(x, _LOG2_RECIPROCAL, _BIAS)
    m = (biased - _BIAS).astype(_F32)
    x = mad(m, _LOG2_HIGH, x)
    x = mad(m, _LOG2_LOW, x)
    p = np.full_like(x, _POLY[0])
    for c in _POLY[1:]:
        p = mad(p, x, c)
    if kernel == "avx512f":
        return np.ldexp(p, m.astype(np.int32)).astype(_F32)
    scale = (biased.view(np.int32) << 23) + np.int32(0x3F800000)
    return (p * scale.view(_F32)).astype(_F32)


def _lanes(e: np.ndarray, lanes: int, unroll: int) -> np.ndarray:
    """The lane accumulators ``[N, lanes]``: ``unroll`` vectors a round, then one at a time
    (the last masked)."""
    n, d = e.shape
    acc = np.zeros((n, lanes), _F32)
    j = 0
    while d - j >= lanes * unroll:
        for k in range(unroll):
            acc = acc + e[:, j + lanes * k : j + lanes * (k + 1)]
        j += lanes * unroll
    while j < d:
        width = min(lanes, d - j)
        acc[:, :width] = acc[:, :width] + e[:, j : j + width]
        j += width
    return acc


def _sum(e: np.ndarray, kernel: str) -> np.ndarray:
    """The row sums of ``e [N, D]`` in ``kernel``'s lane order and reduction tree."""
    if kernel == "sse2":
        full = e.shape[1] // 4 * 4
        acc = _lanes(e[:, :full], 4, 1)
        total = (acc[:, 0] + acc[:, 2]) + (acc[:, 1] + acc[:, 3])
        for j in range(full, e.shape[1]):
            total = total + e[:, j]
        return total.astype(_F32)
    if kernel == "avx512f":
        acc = _lanes(e, 16, 3)
        s = acc[:, 8:] + acc[:, :8]
    else:
        s = _lanes(e, 8, 3)
    low = (s[:, 0] + s[:, 1]) + (s[:, 2] + s[:, 3])
    high = (s[:, 4] + s[:, 5]) + (s[:, 6] + s[:, 7])
    return (low + high).astype(_F32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """The float32 log-softmax of each row of ``x [N, D]`` as onnxruntime's CPU computes it."""
    x = np.asarray(x, _F32)
    shifted = (x - x.max(axis=1, keepdims=True)).astype(_F32)
    kernel, logf = _kernel(), _logf()
    if not kernel or logf is None or not np.isfinite(x).all():
        total = np.exp(shifted).sum(axis=1, keepdims=True, dtype=_F32)
        return (shifted - np.log(total)).astype(_F32)
    sums = _sum(_exp(shifted, kernel), kernel)
    logs = np.array([logf(float(s)) for s in sums], _F32)
    return (shifted - logs[:, None]).astype(_F32)
