"""The floating-point math a oneDNN primitive may use: the CPU side of the precision policy.

``SessionOptions(precision="bf16")`` runs the CPU's float32 Conv, MatMul, Gemm and recurrent
primitives with oneDNN's ``fpmath_mode`` set to bf16: the tensors stay float32 in memory, and
oneDNN converts inputs and weights to bfloat16 inside the kernel (its AMX and AVX-512-BF16
paths), accumulating in float32 (docs/decisions/034-precision-policy.md). The mode is
per thread, set by the CPU backend's runner around a partition's run (``mode``), read where a
primitive is built (``_prim.post_ops``, ``_prim.user_scratchpad``, ``attr``) and part of
every primitive's and packed weight's cache key, so a float32 session and a bf16 session in
one process never share a primitive.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["BF16", "STRICT", "current", "mode", "fpmath_value"]

STRICT = "fp32"
BF16 = "bf16"
#: oneDNN's ``dnnl_fpmath_mode_t``: strict 0, bf16 1 (``dnnl_fpmath_mode2str``).
_VALUES = {STRICT: 0, BF16: 1}

_state = threading.local()


def current() -> str:
    """The calling thread's mode: ``"fp32"`` unless a ``mode`` block set another."""
    return getattr(_state, "mode", STRICT)


def fpmath_value() -> int:
    """oneDNN's value for the calling thread's mode."""
    return _VALUES[current()]


@contextmanager
def mode(name: str) -> Iterator[None]:
    """Primitives built on this thread inside the block use ``name``'s math."""
    if name not in _VALUES:
        raise ValueError(f"no oneDNN math mode {name!r}")
    before = current()
    _state.mode = name
    try:
        yield
    finally:
        _state.mode = before
