"""``export_model``: an ``ir.Model`` becomes an ``onnx.ModelProto`` (the inverse of import).

Invariants:
    * Values are written by name; nested graphs read captured outer values by name, as ONNX
      scoping says, so nothing special is written for captures.
    * Initializers stay initializers (numeric data in ``raw_data``); every value whose type is
      known and that is not a graph input or output gets a ``value_info`` entry.
    * ``node.meta`` and ``value.meta`` (placement and other annotations) are not exported.
    * An IR-version-3 model whose graph gained initializers that are not graph inputs (say
      after constant folding) is written as IR version 4, where that is legal.
"""

from __future__ import annotations

import numpy as np
import onnx

from anychip.errors import GraphError
from anychip.ir.graph import Graph, Model
from anychip.ir.node import Attr, AttrType, Node
from anychip.ir.onnx._convert import array_to_tensor, dense_to_sparse, type_proto_of
from anychip.ir.value import Value

__all__ = ["export_model"]


def export_model(model: Model) -> onnx.ModelProto:
    """Write ``model`` as an ONNX ``ModelProto``.

    Raises:
        GraphError: a value has no name, or an attribute holds a value its type cannot hold.

    Example:
        >>> import anychip.ir as ir
        >>> b = ir.GraphBuilder()
        >>> _ = b.output(b.Relu(b.input("x", ir.DType.FLOAT, [2])), "y")
        >>> proto = export_model(b.build())
        >>> [n.op_type for n in proto.graph.node], proto.graph.output[0].name
        (['Relu'], 'y')
    """
    proto = onnx.ModelProto()
    proto.ir_version = model.ir_version
    if model.ir_version < 4 and _needs_ir4(model.graph):
        proto.ir_version = 4
    imports = dict(model.opset_imports)
    # A pass may add nodes of a domain the source model never imported (fused anychip ops).
    for node in model.graph.walk():
        if node.domain not in imports:
            imports[node.domain] = int(node.version or 1)
    for domain, version in imports.items():
        proto.opset_import.add(domain=domain, version=int(version))
    proto.producer_name = model.producer_name
    proto.producer_version = model.producer_version
    proto.domain = model.domain
    proto.model_version = int(model.model_version)
    proto.doc_string = model.doc
    for key, value in model.metadata.items():
        proto.metadata_props.add(key=key, value=value)
    proto.graph.CopyFrom(_graph(model.graph))
    return proto


def _needs_ir4(graph: Graph) -> bool:
    inputs = {id(v) for v in graph.inputs}
    return any(id(v) not in inputs for v in graph.initializers.values())


def _graph(graph: Graph) -> onnx.GraphProto:
    gp = onnx.GraphProto(name=graph.name, doc_string=graph.doc)
    for value in graph.initializers.values():
        gp.initializer.append(array_to_tensor(value.const, _name(value), value.dtype or None))
        gp.initializer[-1].doc_string = value.doc
    for value in graph.inputs:
        gp.input.append(_value_info(value))
    for node in graph.nodes:
        gp.node.append(_node(node))
    for value in graph.outputs:
        gp.output.append(_value_info(value))
    interface = {id(v) for v in graph.inputs} | {id(v) for v in graph.outputs}
    for node in graph.nodes:
        for value in node.outputs:
            if value is None or id(value) in interface:
                continue
            if value.type_proto is not None or value.dtype != 0:
                gp.value_info.append(_value_info(value))
    return gp


def _name(value: Value) -> str:
    if not value.name:
        producer = value.producer.name if value.producer is not None else "no producer"
        raise GraphError(
            f"a value ({value.type_str()}, {producer}) has no name; every value "
            "needs a unique name before export"
        )
    return value.name


def _value_info(value: Value) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto(name=_name(value), doc_string=value.doc)
    tp = type_proto_of(value)
    if tp is not None:
        vi.type.CopyFrom(tp)
    return vi


def _node(node: Node) -> onnx.NodeProto:
    np_ = onnx.NodeProto(
        op_type=node.op_type, domain=node.domain, name=node.name, doc_string=node.doc
    )
    np_.input.extend("" if v is None else _name(v) for v in node.inputs)
    np_.output.extend("" if v is None else _name(v) for v in node.outputs)
    for attr in node.attributes.values():
        np_.attribute.append(_attribute(attr, node))
    return np_


def _attribute(attr: Attr, node: Node) -> onnx.AttributeProto:
    ap = onnx.AttributeProto(name=attr.name, type=int(attr.type))
    v = attr.value
    t = attr.type
    try:
        if t == AttrType.FLOAT:
            ap.f = float(v)
        elif t == AttrType.INT:
            ap.i = int(v)
        elif t == AttrType.STRING:
            ap.s = _encode(v)
        elif t == AttrType.TENSOR:
            ap.t.CopyFrom(array_to_tensor(np.asarray(v), ""))
        elif t == AttrType.GRAPH:
            ap.g.CopyFrom(_graph(v))
        elif t == AttrType.SPARSE_TENSOR:
            ap.sparse_tensor.CopyFrom(dense_to_sparse(np.asarray(v), attr.name))
        elif t == AttrType.TYPE_PROTO:
            ap.tp.CopyFrom(v)
        elif t == AttrType.FLOATS:
            ap.floats.extend(float(x) for x in v)
        elif t == AttrType.INTS:
            ap.ints.extend(int(x) for x in v)
        elif t == AttrType.STRINGS:
            ap.strings.extend(_encode(x) for x in v)
        elif t == AttrType.TENSORS:
            ap.tensors.extend(array_to_tensor(np.asarray(x), "") for x in v)
        elif t == AttrType.GRAPHS:
            ap.graphs.extend(_graph(g) for g in v)
        elif t == AttrType.SPARSE_TENSORS:
            ap.sparse_tensors.extend(dense_to_sparse(np.asarray(x), attr.name) for x in v)
        elif t == AttrType.TYPE_PROTOS:
            ap.type_protos.extend(v)
        else:
            raise GraphError(f"attribute type {t.name} cannot be exported")
    except (TypeError, ValueError) as e:
        raise GraphError(
            f"node {node.name or node.op_type!r} attribute {attr.name!r} is declared "
            f"{attr.type.name} but holds {type(v).__name__} {v!r:.80}: {e}"
        ) from None
    return ap


def _encode(s: str | bytes) -> bytes:
    if isinstance(s, bytes):
        return s
    return str(s).encode("utf-8", errors="surrogateescape")
