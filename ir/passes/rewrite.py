"""Small graph-editing helpers shared by rewriting passes (fusions, folds, layout changes).

``Names`` makes fresh value names, ``single_use`` says whether a value may vanish,
``new_node`` builds a replacement that keeps the old node's annotations, ``constant`` adds an
initializer and ``attrs`` builds attributes from Python values. Dead nodes and initializers
left behind are removed with ``EliminateDeadCodePass``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.ir.graph import Graph
from anychip.ir.node import Attr, AttrType, Node
from anychip.ir.value import Value

__all__ = ["Names", "single_use", "scalar_const", "new_node", "attrs", "constant", "FLOATS"]

#: The element types the fused kernels compute (ONNX FLOAT, DOUBLE).
FLOATS = (1, 11)


class Names:
    """Fresh value names that do not clash with any name already in ``graph``."""

    def __init__(self, graph: Graph) -> None:
        self.used = {v.name for v in graph.values()}

    def fresh(self, stem: str) -> str:
        name, n = stem, 0
        while name in self.used:
            n += 1
            name = f"{stem}_{n}"
        self.used.add(name)
        return name


def single_use(v: Value, graph: Graph) -> bool:
    """True when ``v`` has one reader and is not an output of ``graph`` (so it may vanish)."""
    return len(v.uses) == 1 and v not in graph.outputs


def scalar_const(v: Value | None) -> float | None:
    """The float value of a one-element constant, else None."""
    if v is None or v.const is None or v.const.size != 1 or v.const.dtype.kind != "f":
        return None
    return float(v.const.reshape(-1)[0])


def attrs(**values: Any) -> dict[str, Attr]:
    """Attributes from Python values (ints, floats, strings and lists of ints or floats)."""
    out = {}
    for k, v in values.items():
        if isinstance(v, str):
            out[k] = Attr(k, AttrType.STRING, v)
        elif isinstance(v, float):
            out[k] = Attr(k, AttrType.FLOAT, v)
        elif isinstance(v, int):
            out[k] = Attr(k, AttrType.INT, v)
        elif v and all(isinstance(x, float) for x in v):
            out[k] = Attr(k, AttrType.FLOATS, [float(x) for x in v])
        else:
            out[k] = Attr(k, AttrType.INTS, [int(x) for x in v])
    return out


def new_node(
    like: Node,
    op_type: str,
    inputs: list[Value | None],
    outputs: list[Value],
    attributes: dict[str, Attr],
    *,
    domain: str = "",
    version: int | None = None,
    name: str = "",
) -> Node:
    """A node that inherits ``like``'s name stem and annotations (device, placement)."""
    node = Node(
        op_type,
        inputs,
        outputs,
        domain=domain,
        version=version if version is not None else like.version,
        attributes=attributes,
        name=name or like.name,
    )
    node.meta.update({k: v for k, v in like.meta.items() if k != "since"})
    node.meta["since"] = version if version is not None else like.meta.get("since", like.version)
    return node


def constant(graph: Graph, names: Names, stem: str, array: np.ndarray) -> Value:
    """A new initializer of ``graph`` holding ``array``."""
    return graph.add_initializer(Value(names.fresh(stem), const=np.ascontiguousarray(array)))
