"""What an OpenVINO device takes, node by node: OpenVINO's own answer (``Core.query_model``).

A node is asked about as a one-node ONNX model of its op, attributes, dtypes and shapes (small
constant inputs kept as constants, since OpenVINO converts some ops differently when an input
is constant). Asking costs a read and a query (about 2 ms and 20 ms), so nodes are asked in
batches: the first question about a graph's node asks about every unasked node of that graph
at once, as one model of independent one-node pieces; each piece's ops are found again by the
prefix of their names. A batch OpenVINO cannot read or query is split in halves until the
nodes it refuses are found, each with OpenVINO's message. Answers are kept per node signature
(op, version, attributes, input and output types, small constants) for the process.

The answer says whether the ONNX frontend converts the node and the device plugin runs every
op it became; whether the result is right is the conformance kit's question
(``claims.py`` holds what the kit measured).
"""

from __future__ import annotations

import hashlib
import re
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.openvino.driver import core, short_error
from anychip.ir.clone import copy_value
from anychip.ir.graph import Graph, Model
from anychip.ir.node import Attr, AttrType, Node

if TYPE_CHECKING:
    from anychip.ir.value import Value

__all__ = ["Prober", "node_key", "shape_key"]

#: Constants up to this size stay constants in a probe (larger ones become inputs).
SMALL_CONST = 1 << 16
_PREFIX = re.compile(r"^n(\d+)_")
_STRUCTURAL = frozenset({"Parameter", "Result", "Constant"})


def shape_key(v: Value) -> Any:
    if v.shape is None:
        return None
    return tuple(d if isinstance(d, int) else "?" for d in v.shape)


def _attr_key(a: Attr) -> Any:
    value = a.value
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, hashlib.sha1(value.tobytes()).hexdigest())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(Attr(a.name, AttrType.UNDEFINED, x)) for x in value)
    return repr(value)


def node_key(node: Node) -> tuple:
    """What the answer about ``node`` depends on."""
    ins = []
    for v in node.inputs:
        if v is None:
            ins.append(None)
            continue
        const = None
        if v.const is not None and v.const.nbytes <= SMALL_CONST:
            const = hashlib.sha1(np.ascontiguousarray(v.const).tobytes()).hexdigest()
        ins.append((int(v.dtype), shape_key(v), const, v.const is not None))
    outs = tuple(None if v is None else (int(v.dtype), shape_key(v)) for v in node.outputs)
    attrs = tuple(sorted((k, _attr_key(a)) for k, a in node.attributes.items()))
    version = node.meta.get("since", node.version)
    return (node.domain, node.op_type, version, node.version, tuple(ins), outs, attrs)


def _piece(i: int, node: Node, graph: Graph) -> None:
    """Add ``node`` to ``graph`` with every value renamed ``n<i>_...``: its own inputs, small
    constants as initializers, its outputs as graph outputs."""
    vmap: dict[int, Value] = {}
    ins: list[Value | None] = []
    for v in node.inputs:
        if v is None:
            ins.append(None)
            continue
        if id(v) not in vmap:
            nv = copy_value(v, f"n{i}_{v.name}")
            if v.const is not None and v.const.nbytes <= SMALL_CONST:
                graph.add_initializer(nv)
            else:
                nv.const = None
                graph.inputs.append(nv)
            vmap[id(v)] = nv
        ins.append(vmap[id(v)])
    outs = [None if v is None else copy_value(v, f"n{i}_{v.name}") for v in node.outputs]
    attrs = {k: Attr(k, a.type, a.value) for k, a in node.attributes.items()}
    graph.append(
        Node(
            node.op_type,
            ins,
            outs,
            domain=node.domain,
            version=node.version,
            attributes=attrs,
            name=f"n{i}_node",
        )
    )
    graph.outputs.extend(v for v in outs if v is not None)


class Prober:
    """Asks one OpenVINO device about nodes; answers kept per ``node_key``."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.answers: dict[tuple, str | None] = {}
        self.probes = 0  # models read and queried (a figure for tests and docs)
        self._lock = threading.Lock()

    def reason(self, node: Node, eligible: Any = None) -> str | None:
        """None when OpenVINO runs ``node`` on this device, else OpenVINO's reason.

        ``eligible(node) -> bool`` picks which other nodes of ``node.graph`` to ask about in
        the same batch (by default every node of it)."""
        key = node_key(node)
        with self._lock:
            if key in self.answers:
                return self.answers[key]
            batch: dict[tuple, Node] = {key: node}
            graph = node.graph
            for other in graph.nodes if graph is not None else ():
                if eligible is not None and not eligible(other):
                    continue
                k = node_key(other)
                if k not in self.answers and k not in batch:
                    batch[k] = other
            self._ask(list(batch.items()))
            return self.answers[key]

    def _ask(self, batch: list[tuple[tuple, Node]]) -> None:
        failed = self._try(batch)
        if failed is None:
            return
        if len(batch) == 1:
            self.answers[batch[0][0]] = failed
            return
        half = len(batch) // 2
        self._ask(batch[:half])
        self._ask(batch[half:])

    def _try(self, batch: list[tuple[tuple, Node]]) -> str | None:
        """Ask about ``batch`` as one model; record the answers and return None, or return
        why the whole model failed (the caller splits it)."""
        from anychip.ir.onnx import export_model

        graph = Graph("probe")
        opsets: dict[str, int] = {}
        for i, (_, node) in enumerate(batch):
            _piece(i, node, graph)
            opsets[node.domain] = max(opsets.get(node.domain, 1), int(node.version or 1))
        self.probes += 1
        c = core()
        try:
            data = export_model(Model(graph, opsets)).SerializeToString()
            model = c.read_model(data)
        except Exception as e:
            return f"OpenVINO's ONNX frontend does not convert it: {short_error(e)}"
        try:
            placed = c.query_model(model, self.device)
        except Exception as e:
            return f"OpenVINO's {self.device} plugin refused it in query_model: {short_error(e)}"
        missing: dict[int, list[str]] = {}
        for op in model.get_ordered_ops():
            kind = op.get_type_name()
            if kind in _STRUCTURAL:
                continue
            name = op.get_friendly_name()
            on = placed.get(name)
            m = _PREFIX.match(name)
            if m is None:
                if on != self.device and len(batch) > 1:
                    return f"an op OpenVINO made ({kind}) is not supported on {self.device}"
                index = 0
            else:
                index = int(m.group(1))
            if on != self.device:
                missing.setdefault(index, []).append(f"{kind}-{op.get_type_info().version_id}")
        for i, (key, node) in enumerate(batch):
            if i in missing:
                ops = ", ".join(sorted(set(missing[i])))
                self.answers[key] = (
                    f"OpenVINO's {self.device} plugin does not run {ops}, which "
                    f"{node.op_type} becomes (Core.query_model)"
                )
            else:
                self.answers[key] = None
        return None
