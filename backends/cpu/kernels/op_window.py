"""Window generators (Hann, Hamming, Blackman) and MelWeightMatrix.

A periodic window of ``size`` is the first ``size`` points of the symmetric window of
``size + 1`` (the spec's definition), i.e. the cosine period is ``size`` instead of
``size - 1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["hann_window", "hamming_window", "blackman_window", "mel_weight_matrix"]


def _phase(size: Any, periodic: int) -> tuple[np.ndarray, int]:
    n = int(np.asarray(size).reshape(-1)[0])
    if n < 0:
        raise KernelError(f"window size must be non-negative, got {n}")
    period = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    return (2 * np.pi * k / period if period > 0 else np.zeros(n)), n


def _out(w: np.ndarray, output_datatype: int) -> np.ndarray:
    return w.astype(DType(output_datatype).numpy)


@kernel("HannWindow", since=17)
def hann_window(size: Any, *, output_datatype: int = 1, periodic: int = 1) -> np.ndarray:
    ph, _ = _phase(size, periodic)
    return _out(0.5 - 0.5 * np.cos(ph), output_datatype)


@kernel("HammingWindow", since=17)
def hamming_window(size: Any, *, output_datatype: int = 1, periodic: int = 1) -> np.ndarray:
    ph, _ = _phase(size, periodic)
    alpha = 25.0 / 46.0
    return _out(alpha - (1 - alpha) * np.cos(ph), output_datatype)


@kernel("BlackmanWindow", since=17)
def blackman_window(size: Any, *, output_datatype: int = 1, periodic: int = 1) -> np.ndarray:
    ph, _ = _phase(size, periodic)
    return _out(0.42 - 0.5 * np.cos(ph) + 0.08 * np.cos(2 * ph), output_datatype)


def _mel(f: np.ndarray | float) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def _hertz(m: np.ndarray) -> np.ndarray:
    return 700.0 * (np.power(10.0, m / 2595.0) - 1.0)


@kernel("MelWeightMatrix", since=17)
def mel_weight_matrix(
    num_mel_bins: Any,
    dft_length: Any,
    sample_rate: Any,
    lower_edge_hertz: Any,
    upper_edge_hertz: Any,
    *,
    output_datatype: int = 1,
) -> np.ndarray:
    mels = int(np.asarray(num_mel_bins).reshape(-1)[0])
    dft = int(np.asarray(dft_length).reshape(-1)[0])
    rate = int(np.asarray(sample_rate).reshape(-1)[0])
    lo = float(np.asarray(lower_edge_hertz).reshape(-1)[0])
    hi = float(np.asarray(upper_edge_hertz).reshape(-1)[0])
    if mels <= 0 or dft <= 0 or rate <= 0 or not 0 <= lo < hi:
        raise KernelError(
            "MelWeightMatrix: need positive num_mel_bins, dft_length and sample_rate and "
            f"0 <= lower_edge_hertz < upper_edge_hertz (got {mels}, {dft}, {rate}, {lo}, {hi})"
        )
    bins = dft // 2 + 1
    # num_mel_bins + 2 band edges on the mel scale, mapped to DFT bin indices. The step is
    # (high - low) / (num_mel_bins + 2), as onnxruntime and the conformance data compute it
    # (the spec text does not fix it), so the top edge lies one step below upper_edge_hertz.
    edges_mel = _mel(lo) + np.arange(mels + 2) * (_mel(hi) - _mel(lo)) / (mels + 2)
    edges = np.floor((dft + 1) * _hertz(edges_mel) / rate).astype(np.int64)
    out = np.zeros((bins, mels), dtype=np.float64)
    for i in range(mels):
        left, center, right = edges[i], edges[i + 1], edges[i + 2]
        if center == left:
            if 0 <= center < bins:
                out[center, i] = 1.0
        else:
            for j in range(left, min(center, bins - 1) + 1):
                out[j, i] = (j - left) / (center - left)
        if right > center:
            for j in range(center, min(right, bins)):
                out[j, i] = (right - j) / (right - center)
    return _out(out, output_datatype)
