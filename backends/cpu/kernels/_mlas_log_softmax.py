"""onnxruntime's float32 log-softmax (MLAS ``MlasComputeSoftmax``) to the bit, where it can be.

BeamSearch sums log-probabilities over many steps and then orders hypotheses by them, so a
one-ulp difference in one log-softmax can swap two hypotheses that onnxruntime scores equal
(decision 056). MLAS computes ``(x - max) - log(sum(exp(x - max)))`` with its own vectorized
exp and summation order, chosen by the CPU: on a CPU with AVX-512F
(``MlasComputeSumExpF32KernelAvx512F``) the exp is a degree-6 polynomial evaluated with fused
multiply-adds after a two-constant range reduction, scaled by ``2^m`` (``vscalefps``), summed
in 16 lanes (48 elements a round, then 16 at a time, masked) and the lanes reduced in a fixed
tree; the logarithm is the C library's ``logf``. That path is reproduced here (a fused
multiply-add is a float64 product and sum rounded to float32, which double-rounds in rare
cases). Elsewhere MLAS takes other kernels (FMA3: 8 lanes; SSE2: 4 lanes, no fusion) that are
not reproduced: the plain numpy log-softmax is used, within an ulp of onnxruntime.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

import numpy as np

__all__ = ["log_softmax"]

_F32 = np.float32
_LOWER_RANGE = _F32(-103.9720840454)
_BIAS = _F32(12582912.0)
_LOG2_RECIPROCAL = _F32(1.44269504088896341)
_LOG2_HIGH = _F32(-6.93145752e-1)
_LOG2_LOW = _F32(-1.42860677e-6)
_POLY = [
    _F32(float.fromhex(c))
    for c in ("0x1.694000p-10", "0x1.125edcp-7", "0x1.555b5ap-5", "0x1.555450p-3")
    + ("0x1.fffff6p-2", "0x1.000000p+0", "0x1.000000p+0")
]


@functools.lru_cache(maxsize=1)
def _avx512f() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512f" in line.split()
    except OSError:
        pass
    return False


@functools.lru_cache(maxsize=1)
def _logf() -> Callable[[float], float] | None:
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).logf
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return fn  # type: ignore[no-any-return]


def _fma(a: np.ndarray, b: np.ndarray | np.float32, c: np.ndarray | np.float32) -> np.ndarray:
    return (np.asarray(a, np.float64) * np.float64(b) + np.asarray(c, np.float64)).astype(_F32)


def _exp_avx512f(x: np.ndarray) -> np.ndarray:
    """MLAS's AVX-512F exp of ``x`` (already shifted by the row maximum)."""
    x = np.maximum(_LOWER_RANGE, x)
    m = (_fma(x, _LOG2_RECIPROCAL, _BIAS) - _BIAS).astype(_F32)
    x = _fma(m, _LOG2_HIGH, x)
    x = _fma(m, _LOG2_LOW, x)
    p = np.full_like(x, _POLY[0])
    for c in _POLY[1:]:
        p = _fma(p, x, c)
    return np.ldexp(p, m.astype(np.int32)).astype(_F32)


def _sum_avx512f(e: np.ndarray) -> np.ndarray:
    """The row sums of ``e [N, D]`` in the kernel's lane order and reduction tree."""
    n, d = e.shape
    acc = np.zeros((n, 16), _F32)
    j = 0
    while d - j >= 48:
        for k in range(3):
            acc = acc + e[:, j + 16 * k : j + 16 * (k + 1)]
        j += 48
    while j < d:
        width = min(16, d - j)
        acc[:, :width] = acc[:, :width] + e[:, j : j + width]
        j += width
    s = acc[:, 8:] + acc[:, :8]
    low = (s[:, 0] + s[:, 1]) + (s[:, 2] + s[:, 3])
    high = (s[:, 4] + s[:, 5]) + (s[:, 6] + s[:, 7])
    return (low + high).astype(_F32)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """The float32 log-softmax of each row of ``x [N, D]`` as onnxruntime's CPU computes it."""
    x = np.asarray(x, _F32)
    shifted = (x - x.max(axis=1, keepdims=True)).astype(_F32)
    logf = _logf()
    if not _avx512f() or logf is None or not np.isfinite(x).all():
        total = np.exp(shifted).sum(axis=1, keepdims=True, dtype=_F32)
        return (shifted - np.log(total)).astype(_F32)
    sums = _sum_avx512f(_exp_avx512f(shifted))
    logs = np.array([logf(float(s)) for s in sums], _F32)
    return (shifted - logs[:, None]).astype(_F32)
