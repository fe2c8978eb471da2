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

from anychip.ir.builder import GraphBuilder
from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph, Model
from anychip.ir.node import Attr, AttrType, Node
from anychip.ir.onnx import export_model, import_model
from anychip.ir.value import Value

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
