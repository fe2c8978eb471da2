"""Kernels that wrap onnx's reference evaluator (``onnx.reference.ops``), for long-tail ops.

Only operators whose native kernel would merely duplicate the reference implementation go
through here (the ai.onnx.ml tree ensembles, TfIdfVectorizer, LabelEncoder); they register
with ``reference=True`` so the placement report names them "reference kernel". The onnx
operator object is built once per node, from the IR node's attributes, and cached.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from anychip.backends.cpu.table import kernel
from anychip.core.run.program import KernelContext
from anychip.errors import UnsupportedOpError
from anychip.ir.dtypes import DType
from anychip.ir.node import AttrType, Node

__all__ = ["register_reference"]

# id(node) -> (node, operator). The node is kept so a recycled id is never mistaken for it;
# the cache is bounded so long-lived processes loading many models do not grow without end.
_CACHE: dict[int, tuple[Node, Any]] = {}
_CACHE_LIMIT = 4096


def _attribute_proto(name: str, atype: AttrType, value: Any) -> onnx.AttributeProto:
    if atype == AttrType.TENSOR:
        value = numpy_helper.from_array(np.asarray(value))
    elif atype == AttrType.TENSORS:
        value = [numpy_helper.from_array(np.asarray(v)) for v in value]
    elif atype in (AttrType.GRAPH, AttrType.GRAPHS):
        raise UnsupportedOpError(f"attribute {name!r}: graph attributes are not supported here")
    return onnx.helper.make_attribute(
        name, value, attr_type=onnx.AttributeProto.AttributeType.Value(atype.name)
    )


def _node_proto(node: Node) -> onnx.NodeProto:
    proto = onnx.helper.make_node(
        node.op_type,
        [v.name if v is not None else "" for v in node.inputs],
        [v.name if v is not None else "" for v in node.outputs],
        domain=node.domain,
    )
    for name, attr in node.attributes.items():
        proto.attribute.append(_attribute_proto(name, attr.type, attr.value))
    return proto


def _operator(ctx: KernelContext) -> Any:
    node = ctx.node
    hit = _CACHE.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    if node.domain == "ai.onnx.ml":
        from onnx.reference.ops.aionnxml._op_list import load_op
    else:
        from onnx.reference.ops._op_list import load_op

    version = node.meta.get("since") or node.version
    cls = load_op(node.domain, node.op_type, version)
    op = cls(
        _node_proto(node),
        {
            "log": lambda *a: None,
            "verbose": 0,
            "opsets": {node.domain: version},
            "new_ops": None,
        },
    )
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[id(node)] = (node, op)
    return op


def register_reference(
    op_type: str, *, domain: str = "", since: int = 1, dtypes: Iterable[DType] | None = None
) -> None:
    """Register a CPU kernel for ``op_type`` that runs onnx's reference implementation."""

    def run(ctx: KernelContext, *inputs: Any, **_attrs: Any) -> tuple:
        # Trailing omitted optional inputs are dropped: the reference ops default them.
        args = list(inputs)
        while args and args[-1] is None:
            args.pop()
        outs = _operator(ctx).run(*args)
        return tuple(outs)

    run.__name__ = f"reference_{op_type}"
    run.__qualname__ = run.__name__
    kernel(op_type, domain=domain, since=since, dtypes=dtypes, context=True, reference=True)(run)
