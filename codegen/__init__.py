"""anychip's code generator for fused element-wise chains.

Front half (device-independent): ``expr`` (the typed expression IR and its text form),
``onnx_ops`` (ONNX ops lowered onto it), ``program`` (SSA steps and broadcast classes).
Back half: ``emitter.Emitter`` and its subclasses ``c_emitter.CEmitter`` and
``opencl_emitter.OpenCLEmitter``; ``build`` compiles C with gcc and loads it through cffi.

``c_kernel(spec)`` is what the CPU's fused kernel calls: a callable running the generated C
over numpy arrays, or None (no compiler; the caller computes with numpy).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from anychip.codegen.build import load
from anychip.codegen.c_emitter import CEmitter
from anychip.codegen.expr import Expr, parse
from anychip.codegen.program import KernelSpec, Layout, classify

__all__ = ["Expr", "parse", "KernelSpec", "Layout", "classify", "c_kernel", "CFunction"]

_EMITTER = CEmitter()
_cache: dict[tuple[KernelSpec, str], Any] = {}


class CFunction:
    """A built kernel: ``fn(layout, arrays, out)`` with C-contiguous arrays of one dtype."""

    def __init__(self, spec: KernelSpec, ffi: Any, fn: Any) -> None:
        self.spec, self.ffi, self.fn = spec, ffi, fn
        # the array type resolved once (a string is looked up in cffi's cache on every call)
        self.ptr = ffi.typeof(f"{_EMITTER.ctypes[spec.dtype]}[]")

    def __call__(self, layout: Layout, arrays: Sequence[np.ndarray], out: np.ndarray) -> None:
        buf, ptr = self.ffi.from_buffer, self.ptr  # no copy: the arrays' own memory
        ptrs = [buf(ptr, a) for a in arrays]
        self.fn(
            layout.outer, layout.inner, *ptrs, *layout.r_mods, buf(ptr, out, require_writable=True)
        )


def c_kernel(spec: KernelSpec) -> Callable[..., None] | None:
    """The generated C of ``spec``, built once per process (and cached on disk), or None
    when it cannot be built here."""
    key = (spec, os.environ.get("CC", ""))  # a test hides the compiler through CC
    if key in _cache:
        return _cache[key]
    loaded = load(_EMITTER.source(spec), _EMITTER.signature(spec), spec.name)
    _cache[key] = None if loaded is None else CFunction(spec, loaded[0], loaded[2])
    return _cache[key]
