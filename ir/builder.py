"""``GraphBuilder``: write an IR graph in Python, without going through ONNX.

Example::

    b = GraphBuilder(opset=21)
    x = b.input("x", DType.FLOAT, [1, "n"])
    w = b.constant(np.ones((3, 3), np.float32), name="w")   # an initializer
    y = b.Relu(b.op("Gemm", x, w, transB=1))                 # any capitalised name is an op
    b.output(y, "y")
    model = b.build()                                        # shapes inferred, graph verified

Invariants:
    * Every value and node gets a unique name: given names are checked, automatic ones are
      ``<op>_<n>`` (values ``<op lower>_<n>``), shared with nested builders (``subgraph``).
    * Attribute types come from the Python value (``int``, ``float``, ``str``, lists of them,
      ``np.ndarray``, ``ir.Graph``/``GraphBuilder``, ``onnx.TypeProto``, or an ``ir.Attr``);
      where the operator's schema is known it decides (``alpha=1`` is a FLOAT for LeakyRelu,
      an empty list takes the schema's list type).
    * ``build()`` infers dtypes and shapes through ``onnx.shape_inference`` and fills in only
      what is still unknown, then runs ``Graph.verify()``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from anychip.errors import AnychipError, GraphError
from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph, Model
from anychip.ir.node import Attr, AttrType, Node
from anychip.ir.value import Value
from anychip.opsets.schemas import SchemaRegistry, resolve

__all__ = ["GraphBuilder"]


class _Names:
    """Names used by one builder and its nested builders."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.counters: dict[str, int] = {}

    def claim(self, name: str, what: str) -> str:
        if not name:
            raise GraphError(f"{what} needs a non-empty name")
        if name in self.used:
            raise GraphError(
                f"{what} name {name!r} is already used in this graph; names must "
                "be unique (pass another name, or none for an automatic one)"
            )
        self.used.add(name)
        return name

    def fresh(self, stem: str) -> str:
        n = self.counters.get(stem, 0)
        while f"{stem}_{n}" in self.used:
            n += 1
        self.counters[stem] = n + 1
        name = f"{stem}_{n}"
        self.used.add(name)
        return name


class GraphBuilder:
    """Builds one graph (and, through ``subgraph``, the graphs nested in it)."""

    def __init__(
        self,
        name: str = "main",
        opset: int = 21,
        *,
        opsets: dict[str, int] | None = None,
        custom_schemas: SchemaRegistry | None = None,
    ) -> None:
        """Start an empty graph.

        Args:
            name: the graph's name.
            opset: the ``ai.onnx`` opset version the nodes are written against.
            opsets: versions of other domains (``{"ai.onnx.ml": 5, "com.vendor": 2}``); a
                domain first used without an entry here is imported at version 1.
            custom_schemas: schemas of plugin domains, used to type attributes.
        """
        self.graph = Graph(name)
        self.opsets: dict[str, int] = {"": int(opset)}
        for domain, version in (opsets or {}).items():
            self.opsets["" if domain == "ai.onnx" else domain] = int(version)
        self.custom_schemas = custom_schemas
        self._names = _Names()
        self._parent: GraphBuilder | None = None

    # -- graph interface ------------------------------------------------------------------
    def input(
        self,
        name: str,
        dtype: DType | int,
        shape: Sequence[int | str | None] | None,
    ) -> Value:
        """Add a graph input of element type ``dtype`` and ``shape`` (str dims are symbolic)."""
        value = Value(
            self._names.claim(name, "input"), DType(dtype), None if shape is None else list(shape)
        )
        self.graph.inputs.append(value)
        return value

    def constant(self, array: Any, name: str | None = None) -> Value:
        """Add an initializer holding ``array`` (converted with ``np.asarray``)."""
        array = np.asarray(array)
        try:
            DType.from_numpy(array.dtype)
        except AnychipError:
            raise GraphError(
                f"constant {name or ''!r}: numpy dtype {array.dtype} has no ONNX "
                "type; convert the array first"
            ) from None
        if array.dtype.kind in ("U", "S"):
            array = array.astype(object)
        value = Value(self._value_name(name, "const"), const=array)
        return self.graph.add_initializer(value)

    def output(
        self,
        value: Value,
        name: str | None = None,
        *,
        dtype: DType | int | None = None,
        shape: Sequence[int | str | None] | None = None,
    ) -> Value:
        """Mark ``value`` as a graph output, under ``name`` if given; return the output value.

        A value produced by a node of this graph is renamed; anything else (an input, an
        initializer, a captured outer value, a value already output) is passed through an
        ``Identity`` node so that the output can carry its own name. ``dtype`` and ``shape``
        declare the output's type where shape inference cannot find it (a Loop's carried
        values, say); ONNX requires the main graph's outputs to have a known rank.
        """
        out = self._mark_output(value, name)
        if dtype is not None:
            out.dtype = DType(dtype)
        if shape is not None:
            out.shape = tuple(shape)
        return out

    def _mark_output(self, value: Value, name: str | None) -> Value:
        already = any(o is value for o in self.graph.outputs)
        own = value.producer is not None and value.producer.graph is self.graph
        if name is None or name == value.name:
            if not already:
                self.graph.outputs.append(value)
                return value
            # The same value twice among the outputs: the copy needs its own name.
            name = self._names.fresh(value.name)
            self._names.used.discard(name)
        elif own and not already:
            self._names.claim(name, "output")
            self._names.used.discard(value.name)
            value.name = name
            self.graph.outputs.append(value)
            return value
        (out,) = self._add("Identity", [value], 1, "", {}, None, [name])
        self.graph.outputs.append(out)
        return out

    def subgraph(self, name: str) -> GraphBuilder:
        """A builder for a nested graph (If branch, Loop/Scan body) sharing this one's names.

        Nodes of the nested builder may read values of this builder directly: ONNX scoping
        makes them captured values. Pass the nested builder (or its ``.graph``) as the
        attribute value.
        """
        sub = GraphBuilder.__new__(GraphBuilder)
        sub.graph = Graph(name)
        sub.opsets = self.opsets  # shared: a domain first used in a body is imported once
        sub.custom_schemas = self.custom_schemas
        sub._names = self._names
        sub._parent = self
        return sub

    # -- nodes -------------------------------------------------------------------------------
    def op(
        self,
        op_type: str,
        *inputs: Value | np.ndarray | None,
        outputs: int | Sequence[str] = 1,
        domain: str = "",
        name: str | None = None,
        **attributes: Any,
    ) -> Value | tuple[Value, ...]:
        """Append a node; return its output value, or a tuple when it has several.

        Args:
            op_type: the operator name, e.g. ``"Gemm"``.
            *inputs: values (``None`` for an omitted optional input); numpy arrays become
                initializers.
            outputs: how many outputs, or their names.
            domain: the operator's domain ("" is ai.onnx).
            name: the node's name (automatic when omitted).
            **attributes: the operator's attributes as Python values.
        """
        domain = "" if domain == "ai.onnx" else domain
        if isinstance(outputs, int):
            count, names = outputs, None
        else:
            names = list(outputs)
            count = len(names)
        values = [self._as_value(v, op_type, i) for i, v in enumerate(inputs)]
        outs = self._add(op_type, values, count, domain, attributes, name, names)
        return outs[0] if count == 1 else tuple(outs)  # zero outputs give ()

    def __getattr__(self, name: str) -> Callable[..., Value | tuple[Value, ...]]:
        # Only capitalised names are ops, so typos of real attributes still raise.
        if name[:1].isupper():
            return functools.partial(self.op, name)
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")

    def _add(
        self,
        op_type: str,
        inputs: list[Value | None],
        count: int,
        domain: str,
        attributes: dict[str, Any],
        name: str | None,
        out_names: list[str] | None,
    ) -> list[Value]:
        if domain not in self.opsets:
            self.opsets[domain] = 1
        version = self.opsets[domain]
        node_name = self._names.claim(name, "node") if name else self._names.fresh(op_type)
        stem = op_type.lower()
        outs = [
            Value(self._names.claim(n, "output") if out_names else self._names.fresh(stem))
            for n in (out_names or range(count))
        ]
        attrs = {k: self._attr(op_type, domain, version, k, v) for k, v in attributes.items()}
        node = Node(
            op_type,
            inputs,
            list(outs),
            domain=domain,
            version=version,
            attributes=attrs,
            name=node_name,
        )
        self.graph.append(node)
        return outs

    def _as_value(self, v: Any, op_type: str, index: int) -> Value | None:
        if v is None or isinstance(v, Value):
            return v
        if isinstance(v, (np.ndarray, np.generic)):
            return self.constant(v)
        raise GraphError(
            f"{op_type} input {index} is a {type(v).__name__}; pass an ir.Value, None, or a "
            "numpy array (wrap Python numbers with np.array(x, dtype) to choose the dtype)"
        )

    def _value_name(self, name: str | None, stem: str) -> str:
        return self._names.claim(name, "value") if name else self._names.fresh(stem)

    # -- attributes --------------------------------------------------------------------------
    def _attr(self, op_type: str, domain: str, version: int, name: str, v: Any) -> Attr:
        if isinstance(v, Attr):
            return v
        declared = self._schema_attr_type(op_type, domain, version, name)
        if isinstance(v, GraphBuilder):
            v = v.graph
        if isinstance(v, (list, tuple)):
            v = [x.graph if isinstance(x, GraphBuilder) else x for x in v]
        kind = _infer_attr_type(v, declared)
        if kind is None:
            raise GraphError(
                f"{op_type} attribute {name!r}: cannot tell the type of {v!r:.60} (an empty "
                "list needs the operator's schema); pass ir.Attr(name, AttrType.X, value)"
            )
        if declared is not None and declared != kind and not _compatible(kind, declared):
            raise GraphError(
                f"{op_type} attribute {name!r} must be {declared.name} by the operator's "
                f"schema, got {kind.name} ({v!r:.60})"
            )
        return Attr(name, declared or kind, _coerce(v, declared or kind))

    def _schema_attr_type(
        self, op_type: str, domain: str, version: int, name: str
    ) -> AttrType | None:
        try:
            schema = resolve(op_type, domain, version, self.custom_schemas)
        except AnychipError:
            return None  # unknown op: the Python value alone types the attribute
        attr = schema.attributes.get(name)
        if attr is None:
            raise GraphError(
                f"{op_type} (opset {version}) has no attribute {name!r}; it has "
                f"{sorted(schema.attributes) or 'none'}"
            )
        return AttrType(int(attr.type))

    # -- finishing ---------------------------------------------------------------------------
    def build(self, *, ir_version: int = 10) -> Model:
        """The finished model: types inferred where unknown, graph verified.

        Raises:
            GraphError: the graph breaks an IR invariant (``Graph.verify``).
        """
        if self._parent is not None:
            raise GraphError(
                f"{self.graph.name!r} is a nested graph: build the outermost "
                "builder, passing this one as an attribute"
            )
        model = Model(self.graph, dict(self.opsets), ir_version=ir_version)
        model.producer_name = "anychip.GraphBuilder"
        _infer_types(model)
        model.graph.verify()
        return model


def _infer_attr_type(v: Any, declared: AttrType | None) -> AttrType | None:
    if isinstance(v, bool) or isinstance(v, (int, np.integer)):
        return AttrType.INT
    if isinstance(v, (float, np.floating)):
        return AttrType.FLOAT
    if isinstance(v, (str, bytes)):
        return AttrType.STRING
    if isinstance(v, np.ndarray):
        return AttrType.TENSOR
    if isinstance(v, Graph):
        return AttrType.GRAPH
    if isinstance(v, onnx.TypeProto):
        return AttrType.TYPE_PROTO
    if isinstance(v, list):
        if not v:
            return declared
        kinds = {_infer_attr_type(x, None) for x in v}
        if kinds == {AttrType.INT}:
            return AttrType.INTS
        if kinds <= {AttrType.INT, AttrType.FLOAT}:
            return AttrType.FLOATS
        single = {
            AttrType.STRING: AttrType.STRINGS,
            AttrType.TENSOR: AttrType.TENSORS,
            AttrType.GRAPH: AttrType.GRAPHS,
            AttrType.TYPE_PROTO: AttrType.TYPE_PROTOS,
        }
        if len(kinds) == 1:
            return single.get(kinds.pop())
    return None


def _compatible(given: AttrType, declared: AttrType) -> bool:
    """Whether a value typed ``given`` may be stored as ``declared`` (ints widen to floats)."""
    widen = {
        (AttrType.INT, AttrType.FLOAT),
        (AttrType.INTS, AttrType.FLOATS),
        (AttrType.TENSOR, AttrType.SPARSE_TENSOR),
        (AttrType.TENSORS, AttrType.SPARSE_TENSORS),
    }
    return (given, declared) in widen


def _coerce(v: Any, kind: AttrType) -> Any:
    if kind == AttrType.INT:
        return int(v)
    if kind == AttrType.FLOAT:
        return float(v)
    if kind == AttrType.STRING:
        return v.decode() if isinstance(v, bytes) else v
    if kind == AttrType.INTS:
        return [int(x) for x in v]
    if kind == AttrType.FLOATS:
        return [float(x) for x in v]
    if kind == AttrType.STRINGS:
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    if kind in (AttrType.TENSORS, AttrType.SPARSE_TENSORS):
        return [np.asarray(x) for x in v]
    if kind == AttrType.GRAPHS:
        return list(v)
    return v


def _infer_types(model: Model) -> None:
    """Copy dtypes/shapes found by ONNX shape inference onto values whose type is unknown."""
    import onnx.shape_inference

    from anychip.ir.onnx import export_model
    from anychip.ir.onnx._convert import apply_type

    try:
        proto = onnx.shape_inference.infer_shapes(
            export_model(model), strict_mode=False, data_prop=True
        )
    except Exception:  # best-effort, as on import: types stay unknown where inference fails
        return
    found: dict[str, onnx.TypeProto] = {}
    _collect_types(proto.graph, found)
    for value in _all_values(model.graph):
        tp = found.get(value.name)
        if tp is None or value.is_const:
            continue
        if value.dtype == DType.UNDEFINED or (value.shape is None and value.is_tensor):
            dtype, shape = value.dtype, value.shape
            apply_type(value, tp)
            # What the user declared wins over what inference found.
            if dtype != DType.UNDEFINED:
                value.dtype = dtype
            if shape is not None:
                value.shape = shape


def _collect_types(gp: onnx.GraphProto, found: dict[str, onnx.TypeProto]) -> None:
    for vi in list(gp.input) + list(gp.output) + list(gp.value_info):
        if vi.type.WhichOneof("value") is not None:
            found.setdefault(vi.name, vi.type)
    for node in gp.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                _collect_types(attr.g, found)
            for g in attr.graphs:
                _collect_types(g, found)


def _all_values(graph: Graph) -> list[Value]:
    out = list(graph.values())
    for node in graph.nodes:
        for sub in node.subgraphs():
            out.extend(_all_values(sub))
    return out
