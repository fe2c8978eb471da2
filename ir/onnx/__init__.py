"""ONNX import and export for the anychip IR.

``import_model`` reads a file, bytes or ``onnx.ModelProto`` into an ``ir.Model`` (validated,
functions inlined, external data read only from inside the model's folder, nested graphs kept
as IR graphs); ``export_model`` writes an ``ir.Model`` back as an ``onnx.ModelProto``.
"""

from anychip.ir.onnx._export import export_model
from anychip.ir.onnx._import import import_model

__all__ = ["import_model", "export_model"]
