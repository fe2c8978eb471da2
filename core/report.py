"""The placement report: which node runs where and why, the partitions, and the copies.

It is data first (records with attributes) and prints as a table::

    print(sess.placement())
    [n.device for n in sess.placement().nodes if n.op_type == "Conv"]
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

__all__ = ["PlacementReport", "NodeRecord", "PartitionRecord", "CopyInfo", "log_fallbacks"]


class NodeRecord:
    """Where one node runs: ``name``, ``op_type``, ``device``, ``reason``."""

    __slots__ = ("name", "op_type", "device", "reason", "partition")

    def __init__(self, name: str, op_type: str, device: str, reason: str, partition: int) -> None:
        self.name = name
        self.op_type = op_type
        self.device = device
        self.reason = reason
        self.partition = partition

    def __repr__(self) -> str:
        return f"NodeRecord({self.name!r}, {self.op_type}, {self.device}, {self.reason!r})"


class PartitionRecord:
    """One partition: ``index``, ``device``, ``nodes`` (names), ``info`` (backend notes)."""

    __slots__ = ("index", "device", "nodes", "info")

    def __init__(self, index: int, device: str, nodes: list[str], info: dict) -> None:
        self.index = index
        self.device = device
        self.nodes = nodes
        self.info = info

    def __repr__(self) -> str:
        return f"PartitionRecord({self.index}, {self.device}, {len(self.nodes)} nodes)"


class CopyInfo:
    """One copy per run: ``tensor``, ``src``, ``dst``, ``bytes`` (None when shape is dynamic)."""

    __slots__ = ("tensor", "src", "dst", "bytes")

    def __init__(self, tensor: str, src: str, dst: str, nbytes: int | None) -> None:
        self.tensor = tensor
        self.src = src
        self.dst = dst
        self.bytes = nbytes

    def __repr__(self) -> str:
        return f"CopyInfo({self.tensor!r}, {self.src}->{self.dst}, {self.bytes})"


class PlacementReport:
    """``nodes``, ``partitions``, ``copies``, and per-run ``copy_count`` / ``copy_bytes``."""

    def __init__(
        self,
        nodes: list[NodeRecord],
        partitions: list[PartitionRecord],
        copies: list[CopyInfo],
        load_copies: list[CopyInfo],
        devices: list[str],
    ) -> None:
        self.nodes = nodes
        self.partitions = partitions
        self.copies = copies
        self.load_copies = load_copies
        self.devices = devices

    @property
    def copy_count(self) -> int:
        """Copies made on every run."""
        return len(self.copies)

    @property
    def copy_bytes(self) -> int:
        """Bytes copied on every run (tensors of unknown size count 0; see ``copies``)."""
        return sum(c.bytes or 0 for c in self.copies)

    def by_device(self) -> dict[str, int]:
        return dict(Counter(n.device for n in self.nodes))

    def fallbacks(self) -> list[NodeRecord]:
        return [n for n in self.nodes if n.reason.startswith("fallback")]

    def __str__(self) -> str:
        lines = [
            f"placement over devices {', '.join(self.devices)}: "
            + ", ".join(f"{d}={c}" for d, c in self.by_device().items())
            + f"; {len(self.partitions)} partitions; {self.copy_count} copies/run "
            f"({self.copy_bytes} bytes)"
        ]
        w = max([len(n.name) for n in self.nodes] + [4])
        wo = max([len(n.op_type) for n in self.nodes] + [7])
        lines.append(f"{'node':<{w}}  {'op':<{wo}}  {'device':<7} part  reason")
        for n in self.nodes:
            lines.append(
                f"{n.name:<{w}}  {n.op_type:<{wo}}  {n.device:<7} {n.partition:>4}  {n.reason}"
            )
        lines.append("partitions:")
        for p in self.partitions:
            extra = "".join(f", {k}={v}" for k, v in p.info.items())
            lines.append(f"  #{p.index} {p.device}: {len(p.nodes)} nodes{extra}")
        lines.append("copies per run:")
        for c in self.copies:
            lines.append(
                f"  {c.tensor}: {c.src} -> {c.dst} ({'?' if c.bytes is None else c.bytes} bytes)"
            )
        if self.load_copies:
            total = sum(c.bytes or 0 for c in self.load_copies)
            lines.append(f"constants copied once at load: {len(self.load_copies)} ({total} bytes)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.__str__()


def log_fallbacks(graph: Any, devices: list[str]) -> None:
    """Warn once per session, on the ``anychip`` logger, which ops fell back from the first
    device (``Session.placement()`` has the reason of each)."""
    fb = [n for n in graph.nodes if str(n.meta.get("placement_reason", "")).startswith("fallback")]
    if fb and len(devices) > 1:
        ops = Counter(n.op_type for n in fb)
        logging.getLogger("anychip").warning(
            "anychip: %d node(s) fell back from %s: %s (see Session.placement())",
            len(fb),
            devices[0],
            ", ".join(f"{op} x{c}" for op, c in ops.most_common()),
        )
