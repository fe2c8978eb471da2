"""A layered (Sugiyama-style) layout of a ``PlacementView``, computed in Python.

The HTML page draws it without Graphviz. Steps:

1. *Folding* (``find_folds``): in a run of consecutive nodes (in partition order) whose (op,
   device) sequence repeats (the blocks of a ResNet stage, the layers of a transformer, with
   their fallbacks), the first repeat is drawn in full and the others become one box,
   expandable on the page. Folding a contiguous stretch of a
   topological order cannot make a cycle, so the folded graph is still a DAG. A fold may span
   partitions (a layer's fallback repeats in every layer); it takes its first partition's
   band, and a partition wholly inside a fold has no box of its own.
2. *Layers*: partitions run one after another, so each partition gets its own band of layers
   (a node's layer is one more than its deepest predecessor's, and at least its band's first);
   the bands never overlap and each partition is drawn as one box.
3. *Order within a layer*: by the barycenter of the predecessors' x (one sweep down), then
   spaced apart from left to right, which keeps chains straight.

Invariants: every view node is in exactly one unit; ``units[i].id == i``; edges between units
are deduplicated and never join a unit to itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anychip.viz.view import PlacementView, ViewEdge

__all__ = ["Unit", "UnitEdge", "Layout", "find_folds", "layout"]

NODE_W, NODE_H, FOLD_W, FOLD_H = 160, 46, 190, 50
LAYER_GAP, COL_GAP, BAND_PAD = 80, 26, 14
_MIN_FOLD = 6  # nodes


@dataclass(slots=True)
class Unit:
    """One box of the layout: a node (``members`` of one) or a fold of ``reps`` repeats of a
    ``period``-node pattern."""

    id: int
    members: list[int]
    partition: int
    period: int = 1
    reps: int = 1
    layer: int = 0
    x: float = 0.0
    y: float = 0.0
    w: float = NODE_W
    h: float = NODE_H

    @property
    def is_fold(self) -> bool:
        return len(self.members) > 1 or self.reps > 1


@dataclass(slots=True)
class UnitEdge:
    """The tensors from one unit to another; ``copies`` are the view's copy edges among them."""

    src: int
    dst: int
    edges: list[ViewEdge] = field(default_factory=list)

    @property
    def copies(self) -> list[ViewEdge]:
        return [e for e in self.edges if e.is_copy]


@dataclass(slots=True)
class Layout:
    """The boxes (``units``), the edges between them, each partition's band, the size."""

    units: list[Unit]
    edges: list[UnitEdge]
    bands: dict[int, tuple[float, float, float, float]]  # partition -> x, y, w, h
    width: float
    height: float
    unit_of: dict[int, int]  # view node id -> unit id


def find_folds(
    keys: list[object], min_nodes: int = 6, max_period: int = 64
) -> list[tuple[int, int, int]]:
    """``(start, period, reps)`` of each run of ``keys`` (a node's op and device) that repeats
    a ``period``-long pattern ``reps >= 2`` times and holds at least ``min_nodes`` nodes,
    found greedily from the left (the longest cover at each start)."""
    folds, i, n = [], 0, len(keys)
    while i < n:
        best = (0, 0, 0)  # covered, period, reps
        for k in range(1, min(max_period, (n - i) // 2) + 1):
            reps = 1
            while (
                i + (reps + 1) * k <= n
                and keys[i + reps * k : i + (reps + 1) * k] == keys[i : i + k]
            ):
                reps += 1
            if reps >= 2 and k * reps > best[0]:
                best = (k * reps, k, reps)
        if best[0] >= min_nodes:
            folds.append((i, best[1], best[2]))
            i += best[0]
        else:
            i += 1
    return folds


def _units(view: PlacementView, fold: bool) -> tuple[list[Unit], dict[int, int]]:
    # Partitions run in index order, so (partition, graph order) is a topological order in
    # which each partition's nodes are contiguous.
    graph = sorted(view.graph_nodes, key=lambda n: (n.partition, n.id))
    folds = find_folds([(n.op, n.device) for n in graph]) if fold else []
    # The first repeat stays drawn in full (its structure and its copies are seen); the
    # repeats after it are folded, when they hold enough nodes.
    starts = {s + k: (k, r - 1) for s, k, r in folds if (r - 1) * k >= _MIN_FOLD}
    units: list[Unit] = []
    unit_of: dict[int, int] = {}
    inputs = [n for n in view.nodes if n.kind == "input"]
    outputs = [n for n in view.nodes if n.kind == "output"]
    for n in inputs:
        unit_of[n.id] = len(units)
        units.append(Unit(len(units), [n.id], -1))
    i = 0
    while i < len(graph):
        k, r = starts.get(i, (1, 1))
        members = [g.id for g in graph[i : i + k * r]]
        u = Unit(len(units), members, graph[i].partition, k, r)
        if len(members) > 1:
            u.w, u.h = FOLD_W, FOLD_H
        for m in members:
            unit_of[m] = u.id
        units.append(u)
        i += k * r
    for n in outputs:
        unit_of[n.id] = len(units)
        units.append(Unit(len(units), [n.id], 1 << 30))
    return units, unit_of


def layout(view: PlacementView, fold: bool = True) -> Layout:
    """Place every node (or fold) of ``view``; see the module docstring."""
    units, unit_of = _units(view, fold)
    by_pair: dict[tuple[int, int], UnitEdge] = {}
    for e in view.edges:
        a, b = unit_of[e.src], unit_of[e.dst]
        if a != b:
            by_pair.setdefault((a, b), UnitEdge(a, b)).edges.append(e)
    preds: dict[int, list[int]] = {u.id: [] for u in units}
    for a, b in by_pair:
        preds[b].append(a)
    _assign_layers(units, preds)
    layers: dict[int, list[Unit]] = {}
    for u in units:  # units are in topological order
        layers.setdefault(u.layer, []).append(u)
    _order_and_place(layers, preds, units)
    bands = _bands(units)
    width = max(u.x + u.w for u in units) + BAND_PAD * 2
    height = max(u.y + u.h for u in units) + BAND_PAD * 2
    return Layout(units, list(by_pair.values()), bands, width, height, unit_of)


def _assign_layers(units: list[Unit], preds: dict[int, list[int]]) -> None:
    """Longest path from the inputs, each partition in its own band of layers."""
    band_start, deepest, current = 1, 0, None
    for u in units:
        if u.partition == -1:
            u.layer = 0
            continue
        if u.partition != current:
            current, band_start = u.partition, deepest + 1
        u.layer = max([band_start] + [units[p].layer + 1 for p in preds[u.id]])
        deepest = max(deepest, u.layer)


def _order_and_place(
    layers: dict[int, list[Unit]], preds: dict[int, list[int]], units: list[Unit]
) -> None:
    y = BAND_PAD * 2
    for layer in sorted(layers):
        row = layers[layer]
        desired = []
        for pos, u in enumerate(row):
            xs = [units[p].x + units[p].w / 2 for p in preds[u.id] if units[p].layer < layer]
            desired.append(sum(xs) / len(xs) - u.w / 2 if xs else pos * (NODE_W + COL_GAP))
        order = sorted(range(len(row)), key=lambda i: desired[i])
        x_prev = None
        for i in order:
            u = row[i]
            u.x = desired[i] if x_prev is None else max(desired[i], x_prev + COL_GAP)
            x_prev = u.x + u.w
        # Centre the row on what it wanted (spacing pushed it right).
        shift = sum(desired) / len(row) - sum(u.x for u in row) / len(row)
        for u in row:
            u.x += shift
        height = max(u.h for u in row)
        for u in row:
            u.y = y + (height - u.h) / 2
        y += height + LAYER_GAP
    left = min(u.x for u in units)
    for u in units:
        u.x += BAND_PAD * 2 - left


def _bands(units: list[Unit]) -> dict[int, tuple[float, float, float, float]]:
    """The box around each partition's units."""
    boxes: dict[int, list[float]] = {}
    for u in units:
        if u.partition < 0 or u.partition == 1 << 30:
            continue
        b = boxes.setdefault(u.partition, [u.x, u.y, u.x + u.w, u.y + u.h])
        b[0], b[1] = min(b[0], u.x), min(b[1], u.y)
        b[2], b[3] = max(b[2], u.x + u.w), max(b[3], u.y + u.h)
    return {
        p: (
            b[0] - BAND_PAD,
            b[1] - BAND_PAD - 12,
            b[2] - b[0] + 2 * BAND_PAD,
            b[3] - b[1] + 2 * BAND_PAD + 12,
        )
        for p, b in boxes.items()
    }
