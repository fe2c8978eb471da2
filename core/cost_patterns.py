"""Node chains the backends run as one kernel, priced as one: scaled dot-product attention.

``MatMul(Q, Kt) -> Mul|Div(scalar constant) -> [Add(mask)] -> Softmax(last axis) ->
MatMul(., V)``, every intermediate read once and not a graph output, is what the CPU's and the
XPU's ``FuseAttentionPass`` turn into one ``anychip::FusedAttention`` after placement. Priced
node by node, the estimate charges the four scores-sized passes the fused kernels never make
(the CPU's computes its scores in place; the XPU's keeps each block of them in cache), so the
cost model placed the attention where the unfused nodes were cheapest, not where the fused
kernel is. The calibration therefore measures the chain as a whole (the ``attention`` class,
``core/calibration_probes.py``: the same four nodes loaded on the device, so each device's own
fusion is in the figure), and ``Costs`` gives each node of a chain an equal share of the
chain's measured time. Equal shares make every node of a chain want the same move, so the
node-level moves (``core/cost_moves.py``) move a chain whole. A chain split over two devices
is not fused there and is priced too low (a known approximation: the scores tensor such a split
copies makes it rare, and the session's feedback measures it). A device without measured
``attention`` points prices the nodes one by one, as before.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = ["attention_chains", "attention_work"]


def _only_reader(v: Value, outputs: set[Value], ops: tuple[str, ...]) -> Node | None:
    """The one node reading ``v`` (as its first input), when it is one of ``ops``."""
    if v in outputs or len(v.uses) != 1:
        return None
    node, index = v.uses[0]
    ok = not node.domain and node.op_type in ops and index == 0
    return node if ok else None


def _scalar_const(v: Value | None) -> bool:
    return v is not None and v.const is not None and v.const.size == 1


def _last_axis_softmax(node: Node) -> bool:
    shape = node.inputs[0].shape
    rank = len(shape) if shape is not None else 0
    version = node.version or 13
    axis = node.attr("axis", -1 if version >= 13 else 1)
    return rank > 0 and axis in (-1, rank - 1) and (version >= 13 or rank == 2)


def _chain_from(mm: Node, outputs: set[Value]) -> tuple[Node, ...] | None:
    scale = _only_reader(mm.outputs[0], outputs, ("Mul", "Div"))
    if scale is None or not _scalar_const(scale.inputs[1]):
        return None
    chain = [mm, scale]
    nxt = _only_reader(scale.outputs[0], outputs, ("Add", "Softmax"))
    if nxt is not None and nxt.op_type == "Add":
        chain.append(nxt)
        nxt = _only_reader(nxt.outputs[0], outputs, ("Softmax",))
    if nxt is None or nxt.op_type != "Softmax" or not _last_axis_softmax(nxt):
        return None
    chain.append(nxt)
    out = _only_reader(nxt.outputs[0], outputs, ("MatMul",))
    if out is None:
        return None
    chain.append(out)
    return tuple(chain)


def attention_work(chain: tuple[Node, ...]) -> float | None:
    """Multiply-add FLOPs of the chain's two products (None when a shape is unknown)."""
    scores, out = chain[0].outputs[0], chain[-1].outputs[0]
    q = chain[0].inputs[0]
    if not (scores.is_static and out.is_static and q is not None and q.is_static):
        return None
    if not scores.shape or not out.shape or not q.shape:
        return None
    return 2.0 * math.prod(scores.shape) * (q.shape[-1] + out.shape[-1])


def attention_chains(graph: Graph) -> dict[Node, tuple[tuple[Node, ...], float]]:
    """Each node of each attention chain of ``graph`` (static shapes) -> (its chain, the
    chain's work in FLOPs)."""
    outputs = set(graph.outputs)
    found: dict[Node, tuple[tuple[Node, ...], float]] = {}
    for mm in graph.nodes:
        if mm.op_type != "MatMul" or mm.domain or mm in found:
            continue
        chain = _chain_from(mm, outputs)
        work = attention_work(chain) if chain is not None else None
        if chain is None or work is None:
            continue
        for n in chain:
            found[n] = (chain, work)
    return found
