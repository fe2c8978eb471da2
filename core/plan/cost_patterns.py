"""Node chains the backends run as one kernel, priced as one: scaled dot-product attention.

``MatMul(Q, Kt) -> Mul|Div(scalar constant) -> [Add(mask)] -> Softmax(last axis) ->
MatMul(., V)``, matched by ``ir.passes.attention.match_attention`` as the ``FuseAttentionPass``
the CPU and the XPU enable matches it, becomes one ``anychip::FusedAttention`` after placement.
Priced node by node, the estimate charges the four scores-sized passes the fused kernels never make
(the CPU's computes its scores in place; the XPU's keeps each block of them in cache), so the
cost model placed the attention where the unfused nodes were cheapest, not where the fused
kernel is. The calibration therefore measures the chain as a whole (the ``attention`` class,
``core/plan/calibration_probes.py``: the same four nodes loaded on the device, so each device's own
fusion is in the figure), and ``Costs`` gives each node of a chain an equal share of the
chain's measured time, read at its FLOPs from the ``attention`` class, or from
``attention_mask`` for a masked chain (a masked chain runs unfused on the XPU, 16x the
unmasked class's figure for GPT-like's); both are measured up front with every other class
(decisions/032). Equal shares make every node of a
chain want the same move, so the node-level moves (``core/plan/cost_moves.py``) move a chain
whole. A chain split over two devices is not fused there and is priced too low (a known
approximation: the scores tensor such a split copies makes it rare, and the session's feedback
measures it). A device without measured
``attention`` points prices the nodes one by one, as before.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from anychip.ir.passes.attention import match_attention

if TYPE_CHECKING:
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["attention_chains", "attention_work"]


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
    found: dict[Node, tuple[tuple[Node, ...], float]] = {}
    for mm in graph.nodes:
        if mm.op_type != "MatMul" or mm.domain or mm in found:
            continue
        m = match_attention(mm, graph)
        work = attention_work(m.nodes) if m is not None else None
        if m is None or work is None:
            continue
        for n in m.nodes:
            found[n] = (m.nodes, work)
    return found
