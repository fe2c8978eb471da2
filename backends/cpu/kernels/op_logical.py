"""Comparison and logic kernels: Equal, Greater(OrEqual), Less(OrEqual), Not, And, Or, Xor,
Where. Comparisons return bool; opsets 1-6 use the legacy ``broadcast``/``axis`` rule.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels.op_elementwise import legacy_broadcast
from anychip.backends.cpu.table import kernel
from anychip.ir.dtypes import ALL_TYPES, DType

__all__ = ["not_", "where"]

_COMPARE = {
    "Equal": np.equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
}
_LOGIC = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}
_BOOL = {DType.BOOL}


def _register(name: str, fn, first: int, dtypes) -> None:
    if first == 1:

        @kernel(name, since=1, dtypes=dtypes)
        def legacy(a, b, *, broadcast=0, axis=None):
            return np.asarray(fn(a, legacy_broadcast(a, b, broadcast, axis)), dtype=np.bool_)

        legacy.__name__ = f"{name.lower()}_legacy"

    @kernel(name, since=7 if first == 1 else first, dtypes=dtypes)
    def modern(a, b):
        return np.asarray(fn(a, b), dtype=np.bool_)

    modern.__name__ = name.lower()


for _name, _fn in _COMPARE.items():
    _register(_name, _fn, 12 if _name.endswith("OrEqual") else 1, ALL_TYPES)
for _name, _fn in _LOGIC.items():
    _register(_name, _fn, 1, _BOOL)


@kernel("Not", since=1, dtypes=_BOOL)
def not_(x: np.ndarray) -> np.ndarray:
    """Logical negation."""
    return np.logical_not(x)


@kernel("Where", since=9, dtypes=_BOOL)
def where(condition: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x`` where ``condition`` else ``y``, broadcasting all three."""
    return np.where(condition, x, y)
