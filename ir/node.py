"""``Node``: one operator application, and ``Attr``, one of its attributes.

Ownership and invariants:
    * A node owns its output values (``value.producer is node``) and records itself in the
      ``uses`` of each input value. Change inputs only through ``replace_input`` so the links
      stay true; ``Graph.verify()`` checks them.
    * ``inputs`` and ``outputs`` may hold ``None`` for an omitted optional slot.
    * ``version`` is the operator-set version in force for the node's domain (the model's opset
      import); the schema version a kernel must serve is resolved from it by ``opsets``.
    * Annotations live in ``meta`` (placement writes ``meta["device"]`` and
      ``meta["placement_reason"]``); they are not part of the operator's semantics.
    * Attributes that hold graphs (If/Loop/Scan bodies) own those graphs: ``graph.parent`` is
      this node.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from anychip.ir.value import Value

if TYPE_CHECKING:
    from anychip.ir.graph import Graph

__all__ = ["Node", "Attr", "AttrType"]


class AttrType(enum.IntEnum):
    """ONNX ``AttributeProto.AttributeType`` values."""

    UNDEFINED = 0
    FLOAT = 1
    INT = 2
    STRING = 3
    TENSOR = 4
    GRAPH = 5
    SPARSE_TENSOR = 11
    TYPE_PROTO = 13
    FLOATS = 6
    INTS = 7
    STRINGS = 8
    TENSORS = 9
    GRAPHS = 10
    SPARSE_TENSORS = 12
    TYPE_PROTOS = 14


class Attr:
    """A typed attribute value. Tensors are numpy arrays, graphs are ``ir.Graph`` objects."""

    __slots__ = ("name", "type", "value")

    def __init__(self, name: str, type: AttrType, value: Any) -> None:
        self.name = name
        self.type = AttrType(type)
        self.value = value

    def __repr__(self) -> str:
        return f"Attr({self.name}={self.value!r})"


class Node:
    """An operator applied to input values, producing output values."""

    __slots__ = (
        "name",
        "op_type",
        "domain",
        "version",
        "inputs",
        "outputs",
        "attributes",
        "meta",
        "graph",
        "doc",
    )

    def __init__(
        self,
        op_type: str,
        inputs: list[Value | None],
        outputs: list[Value | None],
        *,
        domain: str = "",
        version: int | None = None,
        attributes: dict[str, Attr] | None = None,
        name: str = "",
    ) -> None:
        self.name = name
        self.op_type = op_type
        self.domain = "" if domain == "ai.onnx" else domain
        self.version = version
        self.inputs: list[Value | None] = []
        self.outputs: list[Value | None] = list(outputs)
        self.attributes: dict[str, Attr] = dict(attributes or {})
        self.meta: dict[str, Any] = {}
        self.graph: Graph | None = None
        self.doc = ""
        for v in inputs:
            self._append_input(v)
        for i, v in enumerate(self.outputs):
            if v is not None:
                v.producer = self
                v.index = i
        for attr in self.attributes.values():
            for g in _graphs_of(attr):
                g.parent = self

    def _append_input(self, v: Value | None) -> None:
        self.inputs.append(v)
        if v is not None:
            v.uses.append((self, len(self.inputs) - 1))

    def replace_input(self, index: int, value: Value | None) -> None:
        """Point input ``index`` at ``value``, keeping use lists true."""
        old = self.inputs[index]
        if old is not None:
            old.uses.remove((self, index))
        self.inputs[index] = value
        if value is not None:
            value.uses.append((self, index))

    def detach(self) -> None:
        """Drop this node's uses of its inputs (before removing it from its graph)."""
        for i, v in enumerate(self.inputs):
            if v is not None and (self, i) in v.uses:
                v.uses.remove((self, i))

    def attr(self, name: str, default: Any = None) -> Any:
        """The value of attribute ``name``, or ``default`` when absent."""
        a = self.attributes.get(name)
        return default if a is None else a.value

    def subgraphs(self) -> list[Graph]:
        """Graphs held by this node's attributes (If branches, Loop/Scan bodies)."""
        out: list[Graph] = []
        for attr in self.attributes.values():
            out.extend(_graphs_of(attr))
        return out

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def __repr__(self) -> str:
        from anychip.ir.printer import format_node

        return format_node(self)


def _graphs_of(attr: Attr) -> list[Graph]:
    if attr.type == AttrType.GRAPH:
        return [attr.value]
    if attr.type == AttrType.GRAPHS:
        return list(attr.value)
    return []
