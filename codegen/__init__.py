"""anychip's code generator for fused element-wise chains.

Front half (device-independent): ``expr`` (the typed expression IR and its text form),
``onnx_ops`` (ONNX ops lowered onto it), ``program`` (SSA steps and broadcast classes).
Back half: ``emitter.Emitter`` and its subclasses ``c_emitter.CEmitter``,
``opencl_emitter.OpenCLEmitter`` and ``cuda_emitter.CudaEmitter``; ``build`` compiles C with gcc
and loads it through cffi. The runtimes that call the generated code live with their backends
(the CPU's: ``backends/cpu/native/fused.py``); nothing here imports a backend.
"""

from __future__ import annotations

from anychip.codegen.expr import Expr, parse
from anychip.codegen.program import KernelSpec, Layout, classify, linearize

__all__ = ["Expr", "parse", "KernelSpec", "Layout", "classify", "linearize"]
