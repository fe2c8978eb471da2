"""The unified graph IR: values, nodes, graphs, a Python builder, and ONNX import/export.

Example:
    >>> import numpy as np
    >>> from anychip import ir
    >>> b = ir.GraphBuilder()
    >>> x = b.input("x", ir.DType.FLOAT, [2, 3])
    >>> y = b.output(b.Relu(x), "y")
    >>> model = b.build()
    >>> model.graph.outputs[0].type_str()
    'f32[2,3]'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from anychip.ir.builder import GraphBuilder
    from anychip.ir.dtypes import DType
    from anychip.ir.graph import Graph, Model
    from anychip.ir.node import Attr, AttrType, Node
    from anychip.ir.onnx import export_model, import_model
    from anychip.ir.value import Value

#: Imported on first access (PEP 562): the builder and ONNX import/export bring onnx, which
#: ``import anychip.ir`` (or the IR classes alone) should not pay for.
_LAZY = {
    "DType": "anychip.ir.dtypes",
    "Value": "anychip.ir.value",
    "Node": "anychip.ir.node",
    "Attr": "anychip.ir.node",
    "AttrType": "anychip.ir.node",
    "Graph": "anychip.ir.graph",
    "Model": "anychip.ir.graph",
    "GraphBuilder": "anychip.ir.builder",
    "import_model": "anychip.ir.onnx",
    "export_model": "anychip.ir.onnx",
}

__all__ = [
    "DType",
    "Value",
    "Node",
    "Attr",
    "AttrType",
    "Graph",
    "Model",
    "GraphBuilder",
    "import_model",
    "export_model",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first access (PEP 562); cached in the module."""
    if name not in _LAZY:
        raise AttributeError(f"module 'anychip.ir' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
