"""Identity: the input itself (kernels never write into their inputs, so no copy is needed)."""

from __future__ import annotations

from typing import Any

from anychip.backends.cpu.table import kernel

__all__ = ["identity"]


@kernel("Identity", since=1, alias=True)
def identity(x: Any = None) -> tuple[Any]:
    """Returns ``x`` unchanged (tensors, and from opset 14 sequences and optionals too).

    The one output is returned as a 1-tuple so a sequence (a list) is never mistaken for
    several outputs.
    """
    return (x,)
