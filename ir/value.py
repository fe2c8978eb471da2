"""``Value``: one tensor (or sequence/optional/map) flowing along graph edges.

Ownership and invariants:
    * A value is produced by at most one node (``producer``, output slot ``index``), or it is a
      graph input, or an initializer (``const`` holds its data), or it is captured by a nested
      graph from an enclosing scope.
    * ``uses`` lists every ``(node, input_index)`` that reads it, including nodes of nested
      graphs; ``Node`` keeps it current, so nothing outside ``Node`` edits it.
    * ``shape`` is ``None`` when the rank is unknown, else a tuple whose entries are ``int``
      (static), ``str`` (a symbolic dimension such as ``"batch"``) or ``None`` (unknown).
    * Non-tensor types (sequences, optionals, maps) keep their ``onnx.TypeProto`` in
      ``type_proto``; ``dtype`` is then the element type when there is one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    from anychip.ir.node import Node

__all__ = ["Value", "Shape", "format_shape"]

Shape = tuple  # tuple[int | str | None, ...]


class Value:
    """An edge of the graph."""

    __slots__ = (
        "name",
        "dtype",
        "shape",
        "producer",
        "index",
        "uses",
        "const",
        "type_proto",
        "meta",
        "doc",
    )

    def __init__(
        self,
        name: str,
        dtype: DType = DType.UNDEFINED,
        shape: Shape | list | None = None,
        *,
        const: np.ndarray | None = None,
        type_proto: Any = None,
    ) -> None:
        self.name = name
        self.dtype = DType(dtype)
        self.shape = tuple(shape) if shape is not None else None
        self.producer: Node | None = None
        self.index = 0
        self.uses: list[tuple[Node, int]] = []
        self.const = const
        if const is not None:
            self.dtype = DType.from_numpy(const.dtype) if self.dtype == 0 else self.dtype
            self.shape = tuple(const.shape)
        self.type_proto = type_proto
        self.meta: dict[str, Any] = {}
        self.doc = ""

    @property
    def is_tensor(self) -> bool:
        """True unless the value is a sequence, optional or map."""
        return self.type_proto is None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when every dimension is a known integer."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def nbytes(self) -> int | None:
        """Bytes of the tensor when its shape is static, else None."""
        if not self.is_static or self.dtype == DType.UNDEFINED or not self.is_tensor:
            return None
        return math.prod(self.shape) * self.dtype.itemsize

    def replace_all_uses_with(self, other: Value) -> None:
        """Make every reader of this value read ``other`` instead."""
        for node, i in list(self.uses):
            node.replace_input(i, other)

    def type_str(self) -> str:
        if not self.is_tensor:
            return _type_proto_str(self.type_proto)
        dt = self.dtype.short if self.dtype != DType.UNDEFINED else "?"
        return dt + format_shape(self.shape)

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.type_str()})"


def format_shape(shape: Shape | None) -> str:
    if shape is None:
        return "[...]"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _type_proto_str(tp: Any) -> str:
    which = tp.WhichOneof("value")
    if which == "sequence_type":
        return "seq(" + _type_proto_str(tp.sequence_type.elem_type) + ")"
    if which == "optional_type":
        return "opt(" + _type_proto_str(tp.optional_type.elem_type) + ")"
    if which == "map_type":
        return (
            f"map({DType(tp.map_type.key_type).short},"
            + _type_proto_str(tp.map_type.value_type)
            + ")"
        )
    if which == "tensor_type":
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tp.tensor_type.shape.dim
        ]
        shape = tuple(dims) if tp.tensor_type.HasField("shape") else None
        return DType(tp.tensor_type.elem_type).short + format_shape(shape)
    return str(which)
