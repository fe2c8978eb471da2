"""Repairs of structural problems that onnxruntime tolerates and ``onnx.checker`` refuses.

Models from old exporters break rules of the ONNX spec that do not make them unsafe to run:
onnxruntime loads them, and so does anychip, after repairing them here in place (the importer
owns the proto) and warning with one line per kind of repair, naming it. Every repair keeps the
model's meaning:

* an initializer not listed among the graph inputs in IR version < 4 (then every initializer
  had to be): it is added as an input, which for those versions means a constant;
* a ``value_info`` without a type: dropped (it carries nothing); a graph output without a type:
  typed from onnx's shape inference, as onnxruntime does;
* nodes in the domain spelled ``ai.onnx``: the default domain ``""`` (an opset import so
  spelled is normalised too, silently: the checker accepts it);
* a graph with an empty name: named ``graph`` (or ``<node>_<attribute>`` for a subgraph);
* ``LayerNormalization`` in an ``ai.onnx`` opset below 17: onnxruntime's contrib op of the same
  name and meaning (registered in the default domain before ONNX adopted it at opset 17); the
  node is moved to the ``com.microsoft`` domain, whose ``LayerNormalization`` is that op;
  likewise ``SimplifiedLayerNormalization`` in the default domain at any opset (ONNX has no
  such op; onnxruntime registers its contrib op there, and its optimizer writes it so);

* a ``Constant`` whose ``value`` attribute holds a sparse tensor: read as ``sparse_value``
  (its output is the dense tensor);
* an ONNX-domain node with no outputs (onnxruntime's test model ``icm-31000000518483`` has an
  ``If`` with neither inputs nor outputs): dropped, since an ONNX op has no effect but its
  outputs;
* an attribute a ``com.microsoft`` op's schema does not define (a misspelt ``epsion`` on
  LayerNormalization in onnxruntime's own fusion tests): dropped, as onnxruntime's kernels
  read only the attributes they know (the default stands in for the misspelt one).

Negative ``dim_value`` is repaired earlier by ``_checks.sanitize`` (a symbolic dimension).
What is unsafe (a cycle, a missing producer, an input without a type, data outside the model's
folder) is not repaired: the later steps refuse it with a ``ModelError``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import onnx

from anychip.errors import warn_caller

__all__ = ["repair", "typed_for_checker"]

_MS = "com.microsoft"
_ONNX = ("", "ai.onnx", "ai.onnx.ml")  # ops without side effects: outputs are all they do


def repair(proto: onnx.ModelProto, infer: object = None) -> list[str]:
    """Repair ``proto`` in place; returns the repairs made (also issued as one warning).

    Args:
        proto: the model, owned by the caller.
        infer: ``ModelProto -> ModelProto`` shape inference used to type untyped outputs
            (``_checks.infer_shapes``); None leaves them untyped.
    """
    done: list[str] = []
    _fix_domain(proto, done)
    _fix_layer_norm(proto, done)
    _fix_sparse_constant(proto, done)
    _drop_outputless(proto, done)
    _drop_unknown_contrib_attributes(proto, done)
    unnamed = []
    for gp, name in _graphs(proto.graph, "graph"):
        if not gp.name:
            gp.name = name
            unnamed.append(name)
        _drop_untyped_value_info(gp, done)
    if unnamed:
        done.append(f"empty graph name(s) (named {unnamed[:3]})")
    _list_initializers(proto, done)
    _type_outputs(proto, infer, done)
    if done:
        warn_caller(
            "anychip repaired what onnxruntime tolerates and onnx.checker refuses: "
            + "; ".join(done)
        )
    return done


def _graphs(graph: onnx.GraphProto, name: str) -> list[tuple[onnx.GraphProto, str]]:
    out = [(graph, name)]
    for node in graph.node:
        for a in node.attribute:
            sub = f"{node.name or node.op_type}_{a.name}"
            if a.HasField("g"):
                out += _graphs(a.g, sub)
            for i, g in enumerate(a.graphs):
                out += _graphs(g, f"{sub}{i}")
    return out


def _all_nodes(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    nodes = [n for g, _ in _graphs(proto.graph, "graph") for n in g.node]
    for fn in proto.functions:
        nodes += list(fn.node)
    return nodes


def _fix_domain(proto: onnx.ModelProto, done: list[str]) -> None:
    spelled = [n for n in _all_nodes(proto) if n.domain == "ai.onnx"]
    for n in spelled:
        n.domain = ""
    imports = {op.domain: op.version for op in proto.opset_import}
    if "ai.onnx" in imports:
        version = imports.get("", imports["ai.onnx"])
        kept = [op for op in proto.opset_import if op.domain not in ("", "ai.onnx")]
        del proto.opset_import[:]
        proto.opset_import.extend(kept)
        proto.opset_import.append(onnx.helper.make_opsetid("", version))
    if spelled:  # an opset import spelled so is accepted by the checker: no warning
        done.append("domain spelled 'ai.onnx' (read as the default domain '')")


def _fix_layer_norm(proto: onnx.ModelProto, done: list[str]) -> None:
    version = {op.domain: op.version for op in proto.opset_import}.get("", 0)
    moved: dict[str, int] = {}
    for n in _all_nodes(proto):
        ln = n.op_type == "LayerNormalization" and version < 17
        if n.domain == "" and (ln or n.op_type == "SimplifiedLayerNormalization"):
            n.domain = _MS
            moved[n.op_type] = moved.get(n.op_type, 0) + 1
    if not moved:
        return
    if not any(op.domain == _MS for op in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(_MS, 1))
    if "LayerNormalization" in moved:
        done.append(
            f"{moved['LayerNormalization']} LayerNormalization node(s) at ai.onnx opset "
            f"{version} (the ONNX op exists from opset 17; read as onnxruntime's contrib op of "
            "the same meaning)"
        )
    if "SimplifiedLayerNormalization" in moved:
        done.append(
            f"{moved['SimplifiedLayerNormalization']} SimplifiedLayerNormalization node(s) in "
            "the ai.onnx domain (no ONNX op: onnxruntime's contrib op, registered there)"
        )


def _fix_sparse_constant(proto: onnx.ModelProto, done: list[str]) -> None:
    """A ``Constant`` whose ``value`` holds a sparse tensor: onnxruntime reads it as the
    ``sparse_value`` it is (its own test model ``sparse_initializer_as_output`` has one)."""
    fixed = []
    for n in _all_nodes(proto):
        if n.op_type != "Constant" or n.domain not in ("", "ai.onnx"):
            continue
        for a in n.attribute:
            if a.name == "value" and a.type == onnx.AttributeProto.SPARSE_TENSOR:
                a.name = "sparse_value"
                fixed.append(n.name or n.output[0])
    if fixed:
        done.append(
            f"{len(fixed)} Constant node(s) with a sparse tensor in 'value' ({fixed[:3]}; read "
            "as 'sparse_value', a dense output)"
        )


def _drop_outputless(proto: onnx.ModelProto, done: list[str]) -> None:
    dropped = []
    for gp, _ in _graphs(proto.graph, "graph"):
        keep = [n for n in gp.node if any(n.output) or n.domain not in _ONNX]
        if len(keep) < len(gp.node):
            dropped += [n.name or n.op_type for n in gp.node if n not in keep]
            del gp.node[:]
            gp.node.extend(keep)
    if dropped:
        done.append(f"{len(dropped)} node(s) with no outputs ({dropped[:3]}; dropped)")


@functools.lru_cache(maxsize=1)
def _contrib_attributes() -> dict[str, frozenset[str]]:
    """Each com.microsoft op's attribute names (its schemas take 2 ms to build: once)."""
    from anychip.opsets.com_microsoft import com_microsoft_schemas

    return {s.name: frozenset(s.attributes) for s in com_microsoft_schemas()}


def _drop_unknown_contrib_attributes(proto: onnx.ModelProto, done: list[str]) -> None:
    contrib = [n for n in _all_nodes(proto) if n.domain == _MS and n.attribute]
    if not contrib:
        return
    known = _contrib_attributes()
    dropped = []
    for n in contrib:
        names = known.get(n.op_type)
        if names is None or all(a.name in names for a in n.attribute):
            continue
        keep = [a for a in n.attribute if a.name in names]
        dropped += [f"{n.op_type}.{a.name}" for a in n.attribute if a.name not in names]
        del n.attribute[:]
        n.attribute.extend(keep)
    if dropped:
        done.append(
            f"{len(dropped)} attribute(s) the com.microsoft schema does not define "
            f"({sorted(set(dropped))[:3]}; dropped, as onnxruntime's kernels ignore them)"
        )


def _drop_untyped_value_info(graph: onnx.GraphProto, done: list[str]) -> None:
    keep = [vi for vi in graph.value_info if _typed(vi.type)]
    dropped = len(graph.value_info) - len(keep)
    if dropped:
        del graph.value_info[:]
        graph.value_info.extend(keep)
        done.append(f"{dropped} value_info entr(ies) without a type in {graph.name!r} (dropped)")


def _typed(tp: onnx.TypeProto) -> bool:
    which = tp.WhichOneof("value")
    if which is None:
        return False
    if which == "tensor_type":
        return tp.tensor_type.elem_type != 0
    return True


def _list_initializers(proto: onnx.ModelProto, done: list[str]) -> None:
    if proto.ir_version >= 4:
        return
    graph = proto.graph
    listed = {vi.name for vi in graph.input}
    missing = [t for t in graph.initializer if t.name not in listed]
    for t in missing:
        graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    if missing:
        names = ", ".join(repr(t.name) for t in missing[:3]) + (", ..." if len(missing) > 3 else "")
        done.append(
            f"{len(missing)} initializer(s) not listed as graph inputs in IR version "
            f"{proto.ir_version} ({names}; added as constant inputs)"
        )


def _type_outputs(proto: onnx.ModelProto, infer: object, done: list[str]) -> None:
    untyped = [vi for vi in proto.graph.output if not _typed(vi.type)]
    if not untyped or infer is None:
        return
    inferred = infer(proto)  # type: ignore[operator]
    types = {vi.name: vi.type for vi in (*inferred.graph.value_info, *inferred.graph.output)}
    fixed = []
    for vi in untyped:
        tp = types.get(vi.name)
        if tp is not None and _typed(tp):
            vi.type.CopyFrom(tp)
            fixed.append(vi.name)
    if fixed:
        done.append(f"graph output(s) {fixed} without a type (typed by shape inference)")


@contextlib.contextmanager
def typed_for_checker(proto: onnx.ModelProto) -> Iterator[None]:
    """Placeholder types while ``onnx.checker`` runs, removed after it.

    The checker requires a type with a shape field on graph inputs and outputs; onnxruntime
    does not (it infers what is missing, including the outputs of its contrib ops, which
    onnx's inference cannot type). A tensor type without a shape field gets an empty one, an
    output's or value's missing type a float placeholder (an input's stays missing: feeding an
    input of unknown type is refused); both are cleared again, so nothing is made up for the
    conversion (the value stays of unknown shape or type).
    """
    no_type, no_shape = [], []
    for graph, _ in _graphs(proto.graph, "graph"):
        inputs = {id(vi) for vi in graph.input}
        for vi in (*graph.input, *graph.output, *graph.value_info):
            which = vi.type.WhichOneof("value")
            untyped = which is None or (
                which == "tensor_type" and not vi.type.tensor_type.elem_type
            )
            if untyped and id(vi) in inputs:
                continue  # an input of unknown type is unsafe: the checker refuses it
            if untyped:
                vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
                no_type.append(vi)
            if which in (None, "tensor_type") and not vi.type.tensor_type.HasField("shape"):
                vi.type.tensor_type.shape.SetInParent()
                no_shape.append(vi)
    try:
        yield
    finally:
        for vi in no_shape:
            vi.type.tensor_type.ClearField("shape")
        for vi in no_type:
            vi.ClearField("type")
