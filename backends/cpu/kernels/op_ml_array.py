"""ai.onnx.ml elementwise helpers written natively: ArrayFeatureExtractor and Binarizer."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["array_feature_extractor", "binarizer"]

_ML = "ai.onnx.ml"


@kernel("ArrayFeatureExtractor", domain=_ML, since=1)
def array_feature_extractor(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
    x = x if type(x) is np.ndarray else np.asarray(x)
    idx = indices
    if type(idx) is not np.ndarray or idx.dtype != np.int64 or idx.ndim != 1:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    last = x.shape[-1] if x.ndim else 0
    # A few indices (skl2onnx's PolynomialFeatures reads two per node, 90 nodes): checked as
    # Python ints, cheaper than two numpy reductions.
    few = idx.tolist() if idx.size <= 16 else None
    if few is not None:
        bad = bool(few) and (min(few) < 0 or max(few) >= last)
    else:
        bad = bool(idx.size) and (idx.min() < 0 or idx.max() >= last)
    if bad:
        raise KernelError(
            f"ArrayFeatureExtractor: indices {idx.tolist()} out of range for a last axis of "
            f"size {last}"
        )
    if x.ndim == 1:
        # A 1-D input is treated as one row, so the output is (1, len(indices)).
        return x[idx].reshape(1, -1)
    # Not x.take: indexing lays the columns out one after the other (a transposed view), so a
    # reduction across the few picked columns (ReduceProd next) runs over long rows; after
    # take, C-ordered, it ran 300 loops of two elements (2.9 -> 6.2 us a node).
    return x[..., idx]


@kernel("Binarizer", domain=_ML, since=1)
def binarizer(x: np.ndarray, *, threshold: float = 0.0) -> np.ndarray:
    x = np.asarray(x)
    return (x > threshold).astype(x.dtype)
