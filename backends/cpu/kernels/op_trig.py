"""Trigonometric and hyperbolic elementwise kernels: Sin, Cos, Tan, their inverses, and the
hyperbolic family (Sinh, Cosh, Asinh, Acosh, Atanh).

bfloat16 (opset 22) computes in float32 and casts back; the others compute natively.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from anychip.backends.cpu.kernels._common import FLOAT_WITH_BF16, unary_float
from anychip.backends.cpu.table import kernel

__all__: list[str] = []


def _register(op: str, fn: Callable[[np.ndarray], np.ndarray], since: int) -> None:
    def impl(x: np.ndarray) -> np.ndarray:
        return unary_float(fn, x)

    impl.__name__ = op.lower()
    impl.__qualname__ = impl.__name__
    kernel(op, since=since, dtypes=FLOAT_WITH_BF16)(impl)


for _op, _fn, _since in (
    ("Sin", np.sin, 7),
    ("Cos", np.cos, 7),
    ("Tan", np.tan, 7),
    ("Asin", np.arcsin, 7),
    ("Acos", np.arccos, 7),
    ("Atan", np.arctan, 7),
    ("Sinh", np.sinh, 9),
    ("Cosh", np.cosh, 9),
    ("Asinh", np.arcsinh, 9),
    ("Acosh", np.arccosh, 9),
    ("Atanh", np.arctanh, 9),
):
    _register(_op, _fn, _since)
