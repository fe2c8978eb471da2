"""The NPU's kernels: numpy code that runs on views of device memory.

A kernel is registered as a *builder*: ``build(node, ctx) -> run`` is called once, when a
partition is compiled, and returns ``run(xs) -> np.ndarray``, called on every execution. The
builder reads attributes, precomputes what it can, and asks the compile context for constants:

* ``ctx.const(value)``: a compile-time constant as a host array (Reshape's shape, Clip bounds);
  it is not placed in device memory.
* ``ctx.weight(value, pack=None, dtype=None)``: a ``WeightRef`` whose ``.array`` is the
  constant (transformed by ``pack``, stored as ``dtype``) in device memory, placed once.
* ``ctx.fp16``: True when the session asked for ``precision="fp16"``.

``xs[i]`` is the device view of input ``i``, or None when the input is absent or the builder
took it through ``ctx``; other constant inputs are placed in device memory as they are.
Builders read a constant's data only through ``ctx.const`` or ``ctx.weight`` (testing
``value.const is not None`` is fine): a program loaded from its compiled bytes (``blob.py``)
rebuilds the kernels with the stored weights, and a constant that reached its builder only as
a weight is then a NaN-filled stand-in of its shape.
One op family per module, registered where defined with ``@builder(op, ...)``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["BUILDERS", "builder", "load_all", "Run", "round_fp16"]

Run = Callable[[list[Any]], np.ndarray]
#: (domain, op_type) -> builder.
BUILDERS: dict[tuple[str, str], Callable[[Any, Any], Run]] = {}


def builder(*ops: str, domain: str = "") -> Callable[[Callable], Callable]:
    """Register ``fn`` as the builder of ``ops`` in ``domain``."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            BUILDERS[(domain, op)] = fn
        return fn

    return register


def round_fp16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to float16 and widened back to float32 (the fp16 datapath's inputs).

    Magnitudes above float16's range become inf, as on fp16 hardware (no warning)."""
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def load_all() -> None:
    """Import every ``op_*`` module so their decorators register."""
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("op_"):
            importlib.import_module(f"{__name__}.{info.name}")
