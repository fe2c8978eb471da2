"""int64 on OpenVINO: computed as int32, so only values bounded by tensor sizes go there.

OpenVINO's CPU plugin converts int64 tensors to int32 before it computes (measured with
OpenVINO 2026.4: ``Add(2**40 + 1, 2**40)`` gives 1, ``Mul(2**33, 3)`` gives 0). Shapes, sizes
and indices fit in int32 on any tensor this device holds, but an int64 a model computes from
its inputs (a hash, a running count, a timestamp) may not, and anychip's default must never
change results. So a node goes to OpenVINO only where each of its int64 tensors is *bounded*:

* a constant whose values fit in int32;
* an output of an op whose values are sizes or positions (``Shape``, ``Size``, ``ArgMax``,
  ``NonZero``, ``TopK``'s indices, ...);
* an output of any other op all of whose inputs are bounded (booleans are; a float is when
  it was computed from bounded values only: ``Cast(Shape(x))``).

The index input of the gather and scatter family is exempt: an index beyond int32 is outside
any tensor this device holds, which ONNX calls an error anyway. So are Slice's constant starts
and ends, which OpenVINO clamps (``INT64_MAX`` still means "to the end"); non-constant ones
it wraps (``INT64_MAX`` becomes -1), so those must be bounded. A model's int64 inputs are not
bounded (``input_ids`` still reach OpenVINO as ``Gather`` indices; an attention mask's
``Cast`` stays on the next device).

``refusal(node)`` answers per node from a per-graph memo (the last graph asked about: placement
asks about every node of one graph in a row).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.ir.dtypes import DType
from anychip.ir.node import AttrType

if TYPE_CHECKING:
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = ["REASON", "refusal", "is_bounded"]

REASON = "int64 tensors only where bounded by tensor sizes (OpenVINO computes int64 as int32)"
#: Ops whose outputs are sizes or positions within their inputs, whatever the inputs hold.
POSITIONS = frozenset(
    {"Shape", "Size", "ArgMax", "ArgMin", "NonZero", "TopK", "Unique", "NonMaxSuppression"}
)
#: (op, input slot) read as an index into another input.
INDEX_SLOTS = frozenset(
    {
        ("Gather", 1),
        ("GatherElements", 1),
        ("GatherND", 1),
        ("Scatter", 1),
        ("ScatterElements", 1),
        ("ScatterND", 1),
    }
)
#: (op, input slot) whose constant values OpenVINO clamps to int32 with the same meaning:
#: Slice's starts and ends (``INT64_MAX``, "to the end", measured: the same elements).
CLAMPED_SLOTS = frozenset({("Slice", 1), ("Slice", 2)})
_INT32 = np.iinfo(np.int32)
_NESTED = (AttrType.GRAPH, AttrType.GRAPHS)


class _Memo:
    """Bounded-ness of the values of one graph, by ``id(value)`` (the graph is kept alive)."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.size = len(graph.nodes) if graph is not None else 0
        self.known: dict[int, bool] = {}


_lock = threading.Lock()
_last: _Memo | None = None


def _memo_for(graph: Any) -> _Memo:
    global _last
    with _lock:
        memo = _last
        size = len(graph.nodes) if graph is not None else 0
        if memo is None or memo.graph is not graph or memo.size != size:
            memo = _last = _Memo(graph)
        return memo


def _const_bounded(array: np.ndarray) -> bool:
    if array.dtype == np.bool_ or array.size == 0:
        return True
    if array.dtype.kind in "iu":
        return bool(array.min() >= _INT32.min and array.max() <= _INT32.max)
    if array.dtype.kind == "f":
        finite = np.isfinite(array)
        if not finite.all():
            return False
        return bool(np.abs(array).max() <= _INT32.max)
    return False


def _inputs_read(node: Node) -> list[Value]:
    return [
        v
        for i, v in enumerate(node.inputs)
        if v is not None and (node.op_type, i) not in INDEX_SLOTS
    ]


def is_bounded(value: Value, memo: _Memo | None = None) -> bool:
    """Whether ``value``'s numbers fit in int32 whatever the model's inputs hold."""
    memo = memo or _memo_for(getattr(value.producer, "graph", None))
    stack = [value]
    while stack:
        v = stack[-1]
        if id(v) in memo.known:
            stack.pop()
            continue
        if v.const is not None:
            memo.known[id(v)] = _const_bounded(np.asarray(v.const))
        elif v.dtype == DType.BOOL:
            memo.known[id(v)] = True
        elif v.producer is None:
            memo.known[id(v)] = False  # a model input (or a value captured from outside)
        elif v.producer.op_type in POSITIONS and v.dtype == DType.INT64:
            memo.known[id(v)] = True
        elif any(a.type in _NESTED for a in v.producer.attributes.values()):
            memo.known[id(v)] = False  # nested graphs: not followed
        else:
            pending = [u for u in _inputs_read(v.producer) if id(u) not in memo.known]
            if pending:
                stack.extend(pending)
                continue
            memo.known[id(v)] = all(memo.known[id(u)] for u in _inputs_read(v.producer))
        stack.pop()
    return memo.known[id(value)]


def refusal(node: Node) -> str | None:
    """Why ``node`` cannot go to OpenVINO for its int64 tensors, or None."""
    memo = None
    for i, v in enumerate(node.inputs):
        if v is None or v.dtype != DType.INT64 or (node.op_type, i) in INDEX_SLOTS:
            continue
        if (node.op_type, i) in CLAMPED_SLOTS and v.const is not None:
            continue
        memo = memo or _memo_for(node.graph)
        if not is_bounded(v, memo):
            return f"int64 input {v.name!r} is not bounded by tensor sizes ({REASON})"
    if node.op_type in POSITIONS:
        return None
    for v in node.outputs:
        if v is None or v.dtype != DType.INT64:
            continue
        memo = memo or _memo_for(node.graph)
        if not is_bounded(v, memo):
            return f"int64 output {v.name!r} is not bounded by tensor sizes ({REASON})"
    return None
