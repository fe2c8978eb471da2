"""``PlacementView``: a session's placed graph as plain data, for the pictures.

The DOT/SVG picture (``viz/dot.py``) and the self-contained HTML page (``viz/html.py``) both
draw this: one ``ViewNode`` per graph node (plus one per graph input and output, on the host),
one ``ViewEdge`` per (producer, consumer) pair of a tensor, marked as a copy (with its bytes)
where the two ends are on different devices, and the partitions with the cost model's notes.

Invariants:
    * ``nodes[i].id == i``; graph nodes come first, in the graph's (topological) order, then
      inputs and outputs (``kind`` says which).
    * An edge's ``copy_bytes`` is the copy's size from the placement report (None when the
      shape is dynamic and no run measured it yet); ``is_copy`` is set even then.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from anychip.core.plan.partition import HOST
from anychip.core.run.lifecycle import check_open

__all__ = ["ViewNode", "ViewEdge", "ViewPartition", "PlacementView", "placement_view", "COLORS"]

#: Fill colours by device kind/name; other devices take the next colour of ``_PALETTE``.
COLORS = {"cpu": "#f2a65a", "npu": "#5b8fd9", "xpu": "#6cc08b", "cuda": "#b07cc6"}
_PALETTE = ["#e15759", "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac"]
IO_COLOR = "#e8e8e8"


@dataclass(slots=True)
class ViewNode:
    """One box: a graph node (``kind="node"``) or a graph input/output on the host."""

    id: int
    name: str
    op: str
    device: str
    partition: int
    reason: str
    kind: str = "node"
    shape: str = ""

    @property
    def fallback(self) -> bool:
        """The preferred devices could not run it (the report's ``fallback: ...`` reason)."""
        return self.reason.startswith("fallback")


@dataclass(slots=True)
class ViewEdge:
    """A tensor from ``src`` to ``dst`` (node ids); a copy between devices when ``is_copy``."""

    src: int
    dst: int
    tensor: str
    is_copy: bool = False
    copy_bytes: int | None = None
    src_device: str = ""
    dst_device: str = ""


@dataclass(slots=True)
class ViewPartition:
    """A partition: its device, node ids, and the cost model's notes (``info``)."""

    index: int
    device: str
    nodes: list[int]
    info: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """One line: ``#2 npu: 40 nodes; estimate=0.3 ms, alternative=cpu 1.2 ms``."""
        extra = ", ".join(f"{k}={v}" for k, v in self.info.items())
        return f"#{self.index} {self.device}: {len(self.nodes)} nodes" + (
            f"; {extra}" if extra else ""
        )


@dataclass(slots=True)
class PlacementView:
    """Everything a picture of one placement shows (see the module docstring)."""

    title: str
    devices: list[str]
    nodes: list[ViewNode]
    edges: list[ViewEdge]
    partitions: list[ViewPartition]
    decision: str = ""
    summary: dict[str, int] = field(default_factory=dict)
    #: The copies made per run (one per tensor per destination): tensor, src, dst, bytes.
    copies: list[tuple[str, str, str, int | None]] = field(default_factory=list)

    def color(self, device: str) -> str:
        """The fill colour of ``device`` (stable: by name, then by order of appearance)."""
        return device_colors(self.devices).get(device, IO_COLOR)

    @property
    def graph_nodes(self) -> list[ViewNode]:
        return [n for n in self.nodes if n.kind == "node"]

    @property
    def copy_edges(self) -> list[ViewEdge]:
        """Edges whose tensor is copied between devices (several consumers of one copy each
        have their edge)."""
        return [e for e in self.edges if e.is_copy]


def device_colors(devices: list[str]) -> dict[str, str]:
    """A colour per device name: known kinds first (``npu``, ``cuda:0`` -> ``cuda``), then
    the palette in order."""
    out, spare = {}, iter(_PALETTE)
    for d in devices:
        base = d.split(":", 1)[0]
        out[d] = COLORS.get(d) or COLORS.get(base) or next(spare, "#999999")
    return out


def _shape(v: Any) -> str:
    if v is None or v.shape is None:
        return ""
    dims = ",".join(str(d) for d in v.shape)
    return f"{v.dtype.short if v.dtype else '?'}[{dims}]"


def placement_view(session: Any, title: str = "") -> PlacementView:
    """The ``PlacementView`` of a session's current placement."""
    check_open(session)
    report = session.placement()
    graph = session.model.graph
    nodes: list[ViewNode] = []
    id_of: dict[int, int] = {}  # id(ir node) -> view id
    for n, r in zip(graph.nodes, report.nodes):  # the report lists the graph's nodes in order
        id_of[id(n)] = len(nodes)
        shape = _shape(n.outputs[0]) if n.outputs else ""
        nodes.append(
            ViewNode(len(nodes), n.name, n.op_type, r.device, r.partition, r.reason, shape=shape)
        )
    sizes = {(c.tensor, c.src, c.dst): c.size for c in report.copies}
    edges: list[ViewEdge] = []

    def edge(src: ViewNode, dst: ViewNode, tensor: str) -> None:
        copy = src.device != dst.device
        nbytes = sizes.get((tensor, src.device, dst.device)) if copy else None
        edges.append(ViewEdge(src.id, dst.id, tensor, copy, nbytes, src.device, dst.device))

    source: dict[str, ViewNode] = {}
    for v in graph.inputs:
        if v.const is None:
            source[v.name] = ViewNode(
                len(nodes), v.name, "input", HOST, -1, "graph input", "input", _shape(v)
            )
            nodes.append(source[v.name])
    for n in graph.nodes:
        for v in n.outputs:
            if v is not None:
                source[v.name] = nodes[id_of[id(n)]]
    for n in graph.nodes:
        seen: set[str] = set()
        for v in n.inputs:
            if v is None or v.name in seen or v.name not in source:
                continue
            seen.add(v.name)
            edge(source[v.name], nodes[id_of[id(n)]], v.name)
    for v in graph.outputs:
        out = ViewNode(len(nodes), v.name, "output", HOST, -1, "graph output", "output", _shape(v))
        nodes.append(out)
        if v.name in source:
            edge(source[v.name], out, v.name)
    parts = _partitions(report, nodes)
    return PlacementView(
        title or _title(session),
        list(report.devices),
        nodes,
        edges,
        parts,
        report.decision,
        report.summary(),
        [(c.tensor, c.src, c.dst, c.size) for c in report.copies],
    )


def _partitions(report: Any, nodes: list[ViewNode]) -> list[ViewPartition]:
    """The report's partitions, each with the view ids of its nodes."""
    parts = [
        ViewPartition(p.index, p.device, [], {k: str(val) for k, val in p.info.items()})
        for p in report.partitions
    ]
    index = {p.index: p for p in parts}
    for vn in nodes:
        if vn.kind == "node" and vn.partition in index:
            index[vn.partition].nodes.append(vn.id)
    return parts


def _title(session: Any) -> str:
    path = getattr(session.model, "path", None)
    name = os.path.basename(path) if path else session.model.graph.name or "model"
    return f"{name} on {','.join(session.devices)}"  # the file's name: paths are private
