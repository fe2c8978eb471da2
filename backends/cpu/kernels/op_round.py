"""Round: to the nearest integer, halves to even (numpy's rule, and the spec's)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import FLOAT_WITH_BF16, unary_float
from anychip.backends.cpu.table import kernel

__all__ = ["round_"]


@kernel("Round", since=11, dtypes=FLOAT_WITH_BF16)
def round_(x: np.ndarray) -> np.ndarray:
    return unary_float(np.round, x)
