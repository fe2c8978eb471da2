"""Partitioning: maximal cycle-free groups of same-device nodes, and the copies between them.

The rule (the shape of torch.fx's CapabilityBasedPartitioner and onnxruntime's
GetCapability): partitions run one after another in a fixed order. Visiting nodes in
topological order, a node joins the earliest existing partition of its device that comes at
or after every partition holding one of its producers; otherwise it opens a new partition at
the end. So no partition ever waits on a later one (no cycles), and independent branches of
the same device merge.

Every value read on a device other than where it lives gets exactly one copy per destination
device (``CopyRecord``). Graph inputs and outputs live on the host (``cpu``). Constants are not
copied per run: each partition's graph holds them as initializers, moved to its device once
when the session is compiled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anychip.ir.clone import extract_graph

if TYPE_CHECKING:
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = ["Partition", "CopyInfo", "CopyRecord", "partition_graph", "HOST"]

HOST = "cpu"


class Partition:
    """Nodes of one device that run as one unit, with their boundary values.

    ``graph`` is a standalone copy (``ir.clone.extract_graph``) that per-backend passes may
    rewrite and the backend compiles; the original graph is untouched.
    """

    __slots__ = ("index", "device", "nodes", "inputs", "outputs", "graph", "program", "info")

    def __init__(self, index: int, device: str) -> None:
        self.index = index
        self.device = device
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.graph: Graph | None = None
        self.program = None
        self.info: dict = {}

    def __repr__(self) -> str:
        return f"Partition({self.index}, {self.device}, {len(self.nodes)} nodes)"


class CopyInfo:
    """One copy per run: ``tensor``, ``src``, ``dst``, ``bytes`` (static size; None when the
    shape is dynamic), and as the runs measured it: ``runs`` made, ``moved`` bytes in all of
    them, ``last`` bytes in the latest run."""

    __slots__ = ("tensor", "src", "dst", "bytes", "runs", "moved", "last")

    def __init__(
        self,
        tensor: str,
        src: str,
        dst: str,
        nbytes: int | None,
        runs: int = 0,
        moved: int = 0,
        last: int = 0,
    ) -> None:
        self.tensor = tensor
        self.src = src
        self.dst = dst
        self.bytes = nbytes
        self.runs, self.moved, self.last = runs, moved, last

    @property
    def size(self) -> int | None:
        """Bytes of one run: the static size, else what the latest run measured."""
        return self.bytes if self.bytes is not None else (self.last if self.runs else None)

    def __repr__(self) -> str:
        return f"CopyInfo({self.tensor!r}, {self.src}->{self.dst}, {self.size})"


class CopyRecord:
    """One tensor moved from device ``src`` to ``dst`` on every run (or once, at load)."""

    __slots__ = ("tensor", "src", "dst", "bytes", "before")

    def __init__(self, tensor: str, src: str, dst: str, nbytes: int | None, before: int) -> None:
        self.tensor = tensor
        self.src = src
        self.dst = dst
        self.bytes = nbytes
        self.before = before  # index of the partition that first needs it (len: graph output)

    def __repr__(self) -> str:
        size = "?" if self.bytes is None else f"{self.bytes} B"
        return f"Copy({self.tensor}: {self.src} -> {self.dst}, {size})"


def _reads(node: Node) -> list[Value]:
    """Everything ``node`` reads, including outer values captured by its nested graphs."""
    out = [v for v in node.inputs if v is not None]
    for g in node.subgraphs():
        defined = set()
        for inner in g.walk():
            for v in inner.outputs:
                if v is not None:
                    defined.add(v)
        for sub in [g] + [s for n in g.walk() for s in n.subgraphs()]:
            defined.update(sub.inputs)
            defined.update(sub.initializers.values())
        for inner in g.walk():
            out.extend(v for v in inner.inputs if v is not None and v not in defined)
        out.extend(v for v in g.outputs if v not in defined)
    return out


def partition_graph(graph: Graph) -> tuple[list[Partition], list[CopyRecord]]:
    """Split a placed graph (``node.meta["device"]`` set) into partitions and copies."""
    parts: list[Partition] = []
    where: dict[Node, Partition] = {}
    for node in graph.nodes:
        device = node.meta["device"]
        lower = 0
        for v in _reads(node):
            p = where.get(v.producer) if v.producer is not None else None
            if p is not None:
                lower = max(lower, p.index if p.device == device else p.index + 1)
        target = next((p for p in parts[lower:] if p.device == device), None)
        if target is None:
            target = Partition(len(parts), device)
            parts.append(target)
        target.nodes.append(node)
        where[node] = target

    location: dict[Value, str] = {}
    for v in graph.inputs:
        location[v] = HOST
    for p in parts:
        for n in p.nodes:
            for v in n.outputs:
                if v is not None:
                    location[v] = p.device
    copies: list[CopyRecord] = []
    copied: set[tuple[Value, str]] = set()
    graph_outputs = set(graph.outputs)
    for p in parts:
        mine = {v for n in p.nodes for v in n.outputs if v is not None}
        seen: set[Value] = set()
        for n in p.nodes:
            for v in _reads(n):
                if v in mine or v in seen or (v.const is not None and v not in location):
                    continue
                seen.add(v)
                p.inputs.append(v)
                src = location[v]
                if src != p.device and (v, p.device) not in copied:
                    copied.add((v, p.device))
                    copies.append(CopyRecord(v.name, src, p.device, v.nbytes, p.index))
    for p in parts:
        mine_out = [v for n in p.nodes for v in n.outputs if v is not None]
        used_later = {v for q in parts if q is not p for v in q.inputs}
        p.outputs = [v for v in mine_out if v in used_later or v in graph_outputs]
    for v in graph.outputs:
        src = location.get(v)
        if src is not None and src != HOST and (v, HOST) not in copied:
            copied.add((v, HOST))
            copies.append(CopyRecord(v.name, src, HOST, v.nbytes, len(parts)))
    for p in parts:
        p.graph, _ = extract_graph(
            f"{graph.name}.p{p.index}.{p.device}", p.nodes, p.inputs, p.outputs
        )
    return parts, copies
