"""Optional operators: an optional is ``None`` (empty) or the value it holds."""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["optional", "optional_has_element", "optional_get_element"]


@kernel("Optional", since=15)
def optional(x: Any = None, *, type: Any = None) -> Any:
    return (x,)


@kernel("OptionalHasElement", since=15)
def optional_has_element(x: Any = None) -> np.ndarray:
    return np.array(x is not None)


@kernel("OptionalGetElement", since=15)
def optional_get_element(x: Any = None) -> Any:
    if x is None:
        raise KernelError(
            "OptionalGetElement: the optional is empty; guard the read with "
            "OptionalHasElement and an If"
        )
    return (x,)
