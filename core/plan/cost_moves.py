"""Node-level moves: each device takes the part of the graph it is faster at.

Priority placement and the islands rule (``core/plan/placement.py``) decide per island: a connected
group of nodes on an accelerator stays or leaves as a whole. A model whose attention products
run faster on the XPU and whose weight products run faster on the CPU is one island there, so
the whole of it would run on one device or the other. ``move_faster_groups`` refines such a
placement: per node it finds the capable device with the lowest estimated time, groups the
connected nodes that would move from one device to the same other device, and moves a group
when the whole placement's estimate (the nodes' times plus the copies on the group's border)
drops by more than ``MIN_ISLAND_GAIN``. Groups are tried largest estimated saving first, and
the pass repeats (at most ``MAX_PASSES`` times) while something moves. Only kernel-mode devices
take part: a graph-mode device's partitions are compiled as wholes, and its launches are what
the islands rule and ``prefer_single_device`` weigh.

A local search in the spirit of TVM's Collage (which searched placements with measured costs),
kept to one kind of move so that every decision is one line of the placement report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from anychip.core.plan.cost import MIN_ISLAND_GAIN

if TYPE_CHECKING:
    from anychip.core.plan.cost_search import Costs
    from anychip.core.plugin.backend import Backend
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = ["move_faster_groups", "MAX_PASSES"]

MAX_PASSES = 3

#: ``assign(node, backend, why)``: how placement records a move.
Assign = Callable[["Node", "Backend", str], None]


def _value_copy_cost(
    v: Value, device_of: dict[Node, str], costs: Costs, host: str, outputs: set[Value]
) -> float:
    """Seconds of the per-run copies of ``v`` under ``device_of`` (as ``cost_search._copies``
    counts them: one per reading device other than where ``v`` lives)."""
    if v.const is not None:
        return 0.0
    src = device_of.get(v.producer, host) if v.producer is not None else host
    readers = {device_of[u] for u, _ in v.uses if u in device_of}
    if v in outputs:
        readers.add(host)
    seconds = 0.0
    for dst in readers - {src}:
        for d in (src, dst):
            if d != host:
                seconds += costs.copy(v.nbytes, d)
    return seconds


def _delta(
    group: list[Node],
    target: str,
    device_of: dict[Node, str],
    costs: Costs,
    host: str,
    outputs: set[Value],
) -> float | None:
    """Estimated seconds saved by moving ``group`` to ``target`` (None: unknown)."""
    saved = 0.0
    border: set[Value] = set()
    for n in group:
        here, there = costs.node(n, device_of[n]), costs.node(n, target)
        if here is None or there is None:
            return None
        saved += here - there
        border.update(v for v in n.inputs if v is not None)
        border.update(v for v in n.outputs if v is not None)
    before = sum(_value_copy_cost(v, device_of, costs, host, outputs) for v in border)
    moved = dict(device_of)
    moved.update(dict.fromkeys(group, target))
    after = sum(_value_copy_cost(v, moved, costs, host, outputs) for v in border)
    return saved + before - after


def _groups(graph: Graph, want: dict[Node, str], device_of: dict[Node, str]) -> list[list[Node]]:
    """Connected groups of nodes that want the same move (same device now, same target)."""
    parent = {n: n for n in want}

    def find(n: Node) -> Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in want:
        for v in n.inputs:
            p = v.producer if v is not None else None
            if p in want and want[p] == want[n] and device_of[p] == device_of[n]:
                parent[find(n)] = find(p)
    groups: dict[Node, list[Node]] = {}
    for n in graph.nodes:
        if n in want:
            groups.setdefault(find(n), []).append(n)
    return list(groups.values())


def _wanted_moves(
    graph: Graph,
    backends: list[Backend],
    capable: Callable,
    costs: Costs,
    device_of: dict[Node, str],
) -> dict[Node, str]:
    """Per node that would be faster elsewhere under ``device_of``, its fastest device."""
    kernel_mode = [b for b in backends if not b.graph_mode]
    want: dict[Node, str] = {}
    names = {b.name for b in kernel_mode}
    for n in graph.nodes:
        if device_of[n] not in names or n.meta.get("placement_reason") == "pinned":
            continue
        here = costs.node(n, device_of[n])
        if here is None:
            continue
        best, best_t = None, here
        for b in kernel_mode:
            if b.name == device_of[n] or not capable(b, n):
                continue
            t = costs.node(n, b.name)
            if t is not None and t < best_t:
                best, best_t = b.name, t
        if best is not None:
            want[n] = best
    return want


def _search(
    graph: Graph,
    backends: list[Backend],
    capable: Callable,
    costs: Costs,
    device_of: dict[Node, str],
) -> dict[Node, str]:
    """The group moves from ``device_of`` (changed in place); the reason of each move."""
    host = backends[-1].name
    outputs = set(graph.outputs)
    why: dict[Node, str] = {}
    for _ in range(MAX_PASSES):
        want = _wanted_moves(graph, backends, capable, costs, device_of)
        scored = []
        for group in _groups(graph, want, device_of):
            d = _delta(group, want[group[0]], device_of, costs, host, outputs)
            if d is not None and d > MIN_ISLAND_GAIN:
                scored.append((d, group))
        moved = 0
        for _, group in sorted(scored, key=lambda s: -s[0]):
            target = want[group[0]]
            # Earlier moves change the borders: the saving is estimated again.
            d = _delta(group, target, device_of, costs, host, outputs)
            if d is None or d <= MIN_ISLAND_GAIN:
                continue
            src = device_of[group[0]]
            for n in group:
                why[n] = (
                    f"cost: {len(group)} node(s) estimated {d * 1e6:.1f} us faster per run on "
                    f"{target} than on {src}, copies included"
                )
                device_of[n] = target
            moved += len(group)
        if not moved:
            break
    return why


def _host_start(
    graph: Graph, backends: list[Backend], capable: Callable, device_of: dict[Node, str]
) -> dict[Node, str]:
    """``device_of`` with every movable kernel-mode node the host can run on the host."""
    host = backends[-1]
    kernel_mode = {b.name for b in backends if not b.graph_mode}
    out = dict(device_of)
    for n in graph.nodes:
        movable = out[n] in kernel_mode and n.meta.get("placement_reason") != "pinned"
        if movable and capable(host, n):
            out[n] = host.name
    return out


def move_faster_groups(
    graph: Graph, backends: list[Backend], capable: Callable, costs: Costs, assign: Assign
) -> int:
    """Move groups of nodes to the device estimated faster for them when the whole placement's
    estimate improves (see the module docstring); returns the number of nodes moved.

    The moves are searched twice: from the current placement (priority and the islands
    rule: the accelerator first) and from the host-only one (the host first, the
    accelerators taking the groups they are faster at). Greedy moves from one end miss a split
    reached from the other: from the XPU's side the attention's neighbours move one by one
    and leave the block in pieces; from the CPU's side the attention moves as one group. The
    result with the lower whole-placement estimate is applied (the current one on a tie).
    ``capable(backend, node)`` is placement's capability test.
    """
    from anychip.core.plan.cost_search import estimate

    host = backends[-1].name
    by_name = {b.name: b for b in backends}
    current = {n: n.meta["device"] for n in graph.nodes}
    results = []
    for start in (dict(current), _host_start(graph, backends, capable, current)):
        why = _search(graph, backends, capable, costs, start)
        seconds = estimate(graph, start, costs, host).seconds
        results.append((float("inf") if seconds is None else seconds, start, why))
    best = min(results, key=lambda r: r[0])
    _, device_of, why = best
    moved = 0
    for n in graph.nodes:
        if device_of[n] != current[n]:
            reason = why.get(n) or (
                f"cost: the host-first search's placement, estimated {best[0] * 1e3:.3f} ms "
                f"per run against {results[0][0] * 1e3:.3f} ms from the priority placement"
            )
            assign(n, by_name[device_of[n]], reason)
            moved += 1
    return moved
