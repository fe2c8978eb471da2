"""The placement report: which node runs where and why, the partitions, and the copies.

It is data first (records with attributes) and prints as a table::

    print(sess.placement())
    [n.device for n in sess.placement().nodes if n.op_type == "Conv"]
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from anychip.core.logsetup import quiet_fallbacks
from anychip.core.plan.partition import CopyInfo
from anychip.core.report.render import Rendered
from anychip.core.report.why_one_device import why_one_device
from anychip.core.run.lifecycle import check_open

__all__ = [
    "placement_report",
    "PlacementReport",
    "NodeRecord",
    "PartitionRecord",
    "CopyInfo",
    "log_fallbacks",
    "quiet_fallbacks",
]


class NodeRecord:
    """Where one node runs: ``name``, ``op_type``, ``device``, ``reason``; ``priced``: what the
    cost rule that placed it compared, as data, or None (``core/report/why_one_device.py``)."""

    __slots__ = ("name", "op_type", "device", "reason", "partition", "priced")

    def __init__(
        self,
        name: str,
        op_type: str,
        device: str,
        reason: str,
        partition: int,
        priced: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.op_type = op_type
        self.device = device
        self.reason = reason
        self.partition = partition
        self.priced = priced

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


class PlacementReport(Rendered):
    """``nodes``, ``partitions``, ``copies``, and per-run ``copy_count`` / ``copy_bytes``.

    Prints as text; Jupyter and rich show it as tables (``viz/notebook.py``,
    ``viz/terminal.py``, through ``core/report/render.py``)."""

    report_kind = "placement"

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
        #: The cost model's estimate and the feedback's decision, in words ("" without).
        self.decision = ""
        #: Devices a run found failing, with the error; the placement no longer uses them.
        self.unhealthy: dict[str, str] = {}
        #: The nodes each failed device ran before it failed (they now run elsewhere).
        self.failed_over: dict[str, list[str]] = {}
        #: Requests too large for a device that ran on the others: device -> (count, error).
        self.rerouted: dict[str, tuple[int, str]] = {}

    @property
    def copy_count(self) -> int:
        """Copies made on every run."""
        return len(self.copies)

    @property
    def copy_bytes(self) -> int:
        """Bytes copied on every run: static sizes, and for dynamic shapes what the latest run
        measured (0 for a dynamic copy before the first run; see ``copies``)."""
        return sum(c.size or 0 for c in self.copies)

    def by_device(self) -> dict[str, int]:
        return dict(Counter(n.device for n in self.nodes))

    def fallbacks(self) -> list[NodeRecord]:
        """Nodes the preferred devices cannot run (not the ones the cost model moved)."""
        return [n for n in self.nodes if n.reason.startswith("fallback")]

    def summary(self) -> dict[str, int]:
        """Nodes by why they are where they are: ``chosen`` (their first capable device),
        ``fallback`` (the preferred devices cannot run them), ``cost`` (the cost model or the
        policy moved them), ``pinned``, ``failover`` (their device failed during a run)."""
        out = {"chosen": 0, "fallback": 0, "cost": 0, "pinned": 0, "failover": 0}
        for n in self.nodes:
            key = n.reason.split(":", 1)[0].split(" (", 1)[0]
            key = {"fewest copies": "cost", "shape computation": "cost"}.get(key, key)
            out[key if key in out else "cost"] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (JSON-ready): devices, summary, nodes, partitions, copies."""
        return {
            "devices": list(self.devices),
            "by_device": self.by_device(),
            "summary": self.summary(),
            "nodes": [
                {
                    "name": n.name,
                    "op": n.op_type,
                    "device": n.device,
                    "partition": n.partition,
                    "reason": n.reason,
                    "priced": n.priced,
                }
                for n in self.nodes
            ],
            "partitions": [
                {
                    "index": p.index,
                    "device": p.device,
                    "nodes": len(p.nodes),
                    "info": {
                        k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
                        for k, v in p.info.items()
                    },
                }
                for p in self.partitions
            ],
            "copies": [
                {"tensor": c.tensor, "src": c.src, "dst": c.dst, "bytes": c.size}
                for c in self.copies
            ],
            "copy_count": self.copy_count,
            "copy_bytes": self.copy_bytes,
            "decision": self.decision,
            "why_one_device": why_one_device(self),
            "unhealthy": dict(self.unhealthy),
            "failed_over": {d: list(n) for d, n in self.failed_over.items()},
            "rerouted": {d: list(v) for d, v in self.rerouted.items()},
        }

    def failures(self) -> list[str]:
        """One line per device that failed during a run: what failed, and where its nodes
        run now (the first lines of the text form; ``anychip run`` prints them first)."""
        out = []
        for d, why in self.unhealthy.items():
            moved = set(self.failed_over.get(d, ()))
            now = sorted({n.device for n in self.nodes if n.name in moved})
            where = f"; its {len(moved)} node(s) now run on {', '.join(now)}" if moved else ""
            out.append(f"DEVICE FAILED: {d} failed during a run and was taken out{where}: {why}")
        return out

    def __str__(self) -> str:
        lines = self.failures() + [
            f"placement over devices {', '.join(self.devices)}: "
            + ", ".join(f"{d}={c}" for d, c in self.by_device().items())
            + f"; {len(self.partitions)} partitions; {self.copy_count} copies/run "
            f"({self.copy_bytes} bytes)"
        ]
        w = max([len(n.name) for n in self.nodes] + [4])
        wo = max([len(n.op_type) for n in self.nodes] + [7])
        wd = max([len(n.device) for n in self.nodes] + [7])  # openvino:cpu is longer than 7
        lines.append(f"{'node':<{w}}  {'op':<{wo}}  {'device':<{wd}} part  reason")
        for n in self.nodes:
            lines.append(
                f"{n.name:<{w}}  {n.op_type:<{wo}}  {n.device:<{wd}} {n.partition:>4}  {n.reason}"
            )
        lines.append("partitions:")
        for p in self.partitions:
            extra = "".join(f", {k}={v}" for k, v in p.info.items())
            lines.append(f"  #{p.index} {p.device}: {len(p.nodes)} nodes{extra}")
        lines.append("copies per run:")
        for c in self.copies:
            size = "? (dynamic, not run yet)" if c.size is None else c.size
            measured = f"; {c.runs} runs, {c.moved} bytes in all" if c.runs else ""
            lines.append(f"  {c.tensor}: {c.src} -> {c.dst} ({size} bytes{measured})")
        if self.decision:
            lines.append(f"cost model: {self.decision}")
        lines.extend(f"unhealthy: {d}: {why}" for d, why in self.unhealthy.items())
        lines.extend(
            f"rerouted: {n} request(s) too large for {d} ran on the other devices (last: {why})"
            for d, (n, why) in self.rerouted.items()
        )
        if self.load_copies:
            total = sum(c.bytes or 0 for c in self.load_copies)
            lines.append(f"constants copied once at load: {len(self.load_copies)} ({total} bytes)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.__str__()


def placement_report(session: Any) -> PlacementReport:
    """The ``PlacementReport`` of a session: its nodes, partitions, copies (with what the runs
    measured) and the cost model's decision."""
    check_open(session)
    c = session.compiled
    part_of = {n: p.index for p in c.partitions for n in p.nodes}
    nodes = [
        NodeRecord(
            n.name,
            n.op_type,
            n.meta["device"],
            n.meta["placement_reason"],
            part_of[n],
            n.meta.get("priced"),
        )
        for n in c.model.graph.nodes
    ]
    parts = [
        PartitionRecord(p.index, p.device, [n.name for n in p.nodes], dict(p.info))
        for p in c.partitions
    ]
    steps = {s.label: s for s in c.steps.steps if s.is_copy} if c.steps else {}
    copies = []
    for r in c.copies:
        st = steps.get(f"copy {r.tensor} {r.src}->{r.dst}")
        counts = (st.runs, st.moved, st.last) if st is not None else (0, 0, 0)
        copies.append(CopyInfo(r.tensor, r.src, r.dst, r.bytes, *counts))
    report = PlacementReport(nodes, parts, copies, list(c.load_copies), session.devices)
    fb = getattr(session, "feedback", None)
    parts = [
        f"estimated {c.predicted * 1e3:.3f} ms per run" if c.predicted is not None else "",
        c.replaced or (fb.decision if fb is not None else ""),
    ]
    report.decision = "; ".join(p for p in parts if p)
    report.unhealthy = dict(getattr(session, "unhealthy", {}))
    report.failed_over = {d: list(n) for d, n in getattr(session, "failed_over", {}).items()}
    state = getattr(session, "_failover", None)
    report.rerouted = dict(state["rerouted"]) if state else {}
    moved = {name: d for d, names in report.failed_over.items() for name in names}
    for n in report.nodes:
        if n.name in moved and n.device != moved[n.name]:
            n.reason = f"failover: {moved[n.name]} failed during a run ({n.reason})"
    return report


def log_fallbacks(
    graph: Any, devices: list[str], unavailable: dict[str, str] | None = None
) -> None:
    """Warn once per session, on the ``anychip`` logger, which ops could not run on the first
    device, and (apart) how many nodes the cost model kept elsewhere (``Session.placement()``
    has the reason of each). A first device that is not available here (``unavailable``:
    name -> why; ``cuda`` without CuPy) is named as such, with why, not as a list of ops."""
    if len(devices) < 2:
        return
    why = (unavailable or {}).get(devices[0])
    if why is not None:
        logging.getLogger("anychip").warning(
            "anychip: %s is not available: %s; its nodes run on %s",
            devices[0], why, ", ".join(devices[1:]),
        )  # fmt: skip
        return
    reasons = [str(n.meta.get("placement_reason", "")) for n in graph.nodes]
    unable = Counter(n.op_type for n, r in zip(graph.nodes, reasons) if r.startswith("fallback"))
    by_cost = sum(1 for r in reasons if r.startswith(("cost:", "fewest copies:", "shape comp")))
    if not unable and not by_cost:
        return
    parts = []
    if unable:
        ops = ", ".join(f"{op} x{c}" for op, c in unable.most_common())
        parts.append(f"{sum(unable.values())} node(s) could not run on {devices[0]} ({ops})")
    if by_cost:
        parts.append(f"{by_cost} kept off {devices[0]} by the cost model")
    logging.getLogger("anychip").warning("anychip: %s (see Session.placement())", "; ".join(parts))
