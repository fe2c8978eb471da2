"""A fused element-wise chain as one CUDA kernel on CuPy: the code generator's front half
(``anychip.codegen``: the expression, its steps and the inputs' broadcast classes) and its
CUDA emitter (``codegen/cuda_emitter.py``), built by CuPy's ``RawKernel`` once per
(expression, element type, classes) and launched over the output's elements.

Exercised here only up to the launch: the source is compiled by NVRTC and its arithmetic
checked on the host (``tests/codegen/test_cuda_emitter.py``), and the launch's arguments by a
stand-in namespace (``tests/backends/cuda``); running it needs a GPU.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from anychip.codegen import KernelSpec, classify, parse
from anychip.codegen.cuda_emitter import CUDAEmitter

__all__ = ["launch", "source_of", "register", "BLOCK"]

BLOCK = 256
_EMITTER = CUDAEmitter()


@lru_cache(maxsize=1024)
def source_of(expr: str, dtype: str, classes: tuple[str, ...]) -> str:
    """The CUDA source of ``expr`` for one element type and layout."""
    return _EMITTER.source(KernelSpec(parse(expr), dtype, classes))


_kernels: dict[tuple[int, str, str, tuple[str, ...]], Any] = {}


def launch(cp: Any, expr: str, xs: tuple[Any, ...]) -> Any:
    """``expr`` over the CuPy arrays ``xs`` (numpy broadcasting) in one launch."""
    dtype = np.dtype(xs[0].dtype)
    shape = tuple(np.broadcast_shapes(*(tuple(x.shape) for x in xs)))
    layout = classify([tuple(x.shape) for x in xs], shape)
    ins = [
        cp.ascontiguousarray(cp.broadcast_to(x, shape) if c == "X" else x)
        for x, c in zip(xs, layout.classes)
    ]
    classes = layout.built
    key = (id(cp), expr, dtype.name, classes)
    k = _kernels.get(key)
    if k is None:
        k = cp.RawKernel(source_of(expr, dtype.name, classes), "anychip_fused")
        _kernels[key] = k
    out = cp.empty(shape, dtype=dtype)
    n = layout.outer * layout.inner
    if n:
        mods = [np.int64(m) for m in layout.r_mods]
        args = (np.int64(layout.outer), np.int64(layout.inner), *ins, *mods, out)
        k((-(-n // BLOCK),), (BLOCK,), args)
    return out


def register(table: Any) -> None:
    """Put this kernel in a CUDA backend's table over the family's FusedElementwise (the last
    registration of an op and version wins)."""
    from anychip.backends.arrayapi.family._common import as_kernel
    from anychip.backends.arrayapi.family.op_fused import FLOATS, check_types
    from anychip.opsets.schemas import ANYCHIP_DOMAIN

    def fused_elementwise(s: Any, *xs: Any, expr: str) -> Any:
        check_types(xs)
        return launch(s.xp, expr, xs)

    table.register("FusedElementwise", domain=ANYCHIP_DOMAIN, since=1, dtypes=FLOATS)(
        as_kernel(fused_elementwise)
    )
