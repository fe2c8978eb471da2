"""Whole-graph cost: the estimated time of a placement, and the check that no single device
would be faster.

``Costs`` prices a node on a device and a copy over a device's host link, from the measured
calibration where there is one (``core/plan/calibration.py``) and the declared ``DeviceModel``
otherwise, each multiplied by the device's *feedback factor* (measured / estimated time of its
partitions in the session's first runs; 1.0 until then); the nodes of an attention chain share
the chain's measured time (``core/plan/cost_patterns.py``), as the backends run it as one kernel.
``estimate`` sums a placement: every node on its device, every per-run copy (a value read on
another device than the one it lives on; graph inputs and outputs live on the host), and one
launch per partition of a graph-mode device (``Costs.launch``: measured where the device's
calibration has it, and then taken out of each of its nodes' measured times, which were
measured one node per call; decisions/046). ``prefer_single_device`` compares the placement
priority, the island rule and the moves produced with each device that can run the whole
graph alone, and moves every node to the fastest when that is estimated faster by more than
``MARGIN``: adding a device to the list then never makes a model slower, as far as the
estimates are right (and the session's feedback corrects them once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from anychip.core.plan.cost import copy_time, measured_key, node_time
from anychip.core.plan.cost_patterns import attention_chains

if TYPE_CHECKING:
    from anychip.core.plugin.backend import Backend
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["Costs", "Estimate", "estimate", "prefer_single_device", "LAUNCH_FLOOR", "MARGIN"]

#: A single device must be estimated this much faster (relative) to replace a placement.
MARGIN = 0.05
#: A graph-mode node's measured time less its device's launch is at least this share of it
#: (the two are measured apart: a noisy difference must not make a node free).
LAUNCH_FLOOR = 0.1


class Costs:
    """Prices of nodes and copies per device: calibration, else declared figures, times the
    device's feedback factor."""

    def __init__(
        self,
        backends: list[Backend],
        calibrations: dict[str, Any] | None = None,
        factors: dict[str, float] | None = None,
        capable: Any = None,
        unmeasured: float = 0.0,
    ) -> None:
        self.by_name = {b.name: b for b in backends}
        self.cals = dict(calibrations or {})
        self.factors = dict(factors or {})
        #: ``capable(device name, node) -> bool`` (placement's capability), when known.
        self._capable = capable
        self._memo: dict[tuple[Node, str], float | None] = {}
        self._chains: dict[Graph, dict] = {}
        #: Relative uncertainty of a device's declared figures (no calibration here): infinite
        #: unless calibration is ``off``, where the declared figures are the ones chosen.
        self.unmeasured = unmeasured

    def capable(self, device: str, node: Node) -> bool:
        return self._capable is not None and self._capable(device, node)

    def node(self, node: Node, device: str) -> float | None:
        key = (node, device)
        if key not in self._memo:  # the searches ask for the same node many times
            b = self.by_name[device]
            cal = self.cals.get(device)
            t = self._chain_share(node, b, cal)
            if t is None:
                t = node_time(node, b.device, cal)
                launch = self.measured_launch(device)
                if t is not None and launch is not None and measured_key(node, cal) is not None:
                    t = max(t - launch, t * LAUNCH_FLOOR)  # charged per call (``launch``)
            self._memo[key] = None if t is None else t * self.factors.get(device, 1.0)
        return self._memo[key]

    def measured_launch(self, device: str) -> float | None:
        """The measured launch of a graph-mode ``device`` (its calibration's), else None."""
        b = self.by_name[device]
        cal = self.cals.get(device)
        if not b.graph_mode or cal is None:
            return None
        return getattr(cal, "launch", None)

    def launch(self, device: str) -> float:
        """Seconds one call of a partition costs on ``device`` beyond its nodes: measured
        (``Calibration.launch``), else the declared ``launch_overhead``. (The feedback's
        factor, measured over whole partitions, corrects the nodes' times, not this.)"""
        measured = self.measured_launch(device)
        return self.by_name[device].device.launch_overhead if measured is None else measured

    def island_launches(self, device: str, nodes: int) -> float:
        """Seconds saved by running ``nodes`` nodes of ``device`` as one partition call rather
        than as the nodes' times say: with a measured launch the nodes' times hold none and the
        call costs one (a negative saving); with declared figures each node's time holds one
        and the call saves all but one; 0 for a kernel-mode device."""
        if not self.by_name[device].graph_mode:
            return 0.0
        if self.measured_launch(device) is not None:
            return -self.launch(device)
        return self.by_name[device].device.launch_overhead * (nodes - 1)

    def _chain_key(self, node: Node, cal: Any) -> tuple[str, float, int] | None:
        """``node``'s attention chain's key (``attention_mask`` for a masked chain, where
        measured), its work and its length, on a device whose calibration has the class."""
        if cal is None or not cal.points.get("attention") or node.graph is None:
            return None
        chains = self._chains.get(node.graph)
        if chains is None:
            chains = self._chains[node.graph] = attention_chains(node.graph)
        entry = chains.get(node)
        if entry is None:
            return None
        chain, work = entry
        # A masked chain may run unfused (GPT-like's on the XPU: 6.36 ms, the unmasked class
        # read 0.40): it has its class, measured up front like every other.
        masked = len(chain) > 4 and cal.points.get("attention_mask")
        return ("attention_mask" if masked else "attention"), work, len(chain)

    def _chain_share(self, node: Node, backend: Backend, cal: Any) -> float | None:
        """``node``'s equal share of its attention chain's measured time on a device whose
        calibration has the ``attention`` class (``core/plan/cost_patterns.py``), else None."""
        found = self._chain_key(node, cal)
        if found is None:
            return None
        key, work, length = found
        t = cal.time(key, work)
        if t is None:
            return None
        launch = self.measured_launch(backend.name)
        if launch is not None:  # the chain was measured as one call
            t = max(t - launch, t * LAUNCH_FLOOR)
        return t / length

    def uncertainty(self, node: Node, device: str) -> float:
        """Relative uncertainty of ``node``'s time on ``device``: its calibration's for the key
        it is read from, else ``unmeasured`` (declared figures)."""
        cal = self.cals.get(device)
        if cal is None:
            return self.unmeasured
        found = self._chain_key(node, cal)
        key = found[0] if found is not None else measured_key(node, cal)
        return self.unmeasured if key is None else cal.uncertainty(key)

    def copy_uncertainty(self, device: str) -> float:
        """Relative uncertainty of a copy over ``device``'s link."""
        cal = self.cals.get(device)
        b = self.by_name[device]
        if b.device.host_link is None:
            return 0.0
        return self.unmeasured if cal is None or cal.link is None else cal.uncertainty("link")

    def copy(self, nbytes: int | None, device: str) -> float:
        b = self.by_name[device]
        return copy_time(nbytes, b.device, self.cals.get(device)) * self.factors.get(
            "copy:" + device, 1.0
        )


@dataclass
class Estimate:
    """A placement's estimated seconds per run (None: some shape unknown), its per-run copies
    and their bytes (None where a size is unknown), and the seconds per device."""

    seconds: float | None
    copies: int
    copy_bytes: int | None
    per_device: dict[str, float]

    def __str__(self) -> str:
        t = "?" if self.seconds is None else f"{self.seconds * 1e3:.3f} ms"
        return f"{t}, {self.copies} copies"


def estimate(graph: Graph, device_of: dict[Node, str], costs: Costs, host: str) -> Estimate:
    """The time of running ``graph`` with nodes on ``device_of`` (see module docstring)."""
    total: float | None = 0.0
    per_device: dict[str, float] = {}
    for n in graph.nodes:
        t = costs.node(n, device_of[n])
        if t is None:
            total = None
        else:
            per_device[device_of[n]] = per_device.get(device_of[n], 0.0) + t
            if total is not None:
                total += t
    copies, nbytes, copy_s = _copies(graph, device_of, costs, host)
    launches = _graph_mode_launches(graph, device_of, costs)
    if total is not None:
        total += copy_s + launches
    return Estimate(total, copies, nbytes, per_device)


def _copies(
    graph: Graph, device_of: dict[Node, str], costs: Costs, host: str
) -> tuple[int, int | None, float]:
    outputs = set(graph.outputs)
    count, seconds = 0, 0.0
    nbytes: int | None = 0
    for v in graph.values():
        if v.const is not None:
            continue  # constants are copied once, at load
        src = device_of.get(v.producer, host) if v.producer is not None else host
        readers = {device_of[u] for u, _ in v.uses if u in device_of}
        if v in outputs:
            readers.add(host)
        for dst in readers - {src}:
            count += 1
            nbytes = None if nbytes is None or v.nbytes is None else nbytes + v.nbytes
            for d in (src, dst):
                if d != host:
                    seconds += costs.copy(v.nbytes, d)
    return count, nbytes, seconds


def _graph_mode_launches(graph: Graph, device_of: dict[Node, str], costs: Costs) -> float:
    """One launch per run of each graph-mode device's partitions (approximated by the device's
    contiguous runs of nodes in graph order)."""
    seconds, last = 0.0, None
    for n in graph.nodes:
        dev = device_of[n]
        b = costs.by_name[dev]
        if dev != last and b.graph_mode:
            seconds += costs.launch(dev)
        last = dev
    return seconds


def prefer_single_device(
    graph: Graph, backends: list[Backend], capable: Any, costs: Costs, by_copies: bool = False
) -> tuple[Backend, Estimate, Estimate] | None:
    """The device to move every node to, with its estimate and the mixed one's, or None when
    the current placement is estimated best (or cannot be estimated).

    ``capable(backend, node)`` is True when ``backend`` can run ``node``. ``by_copies``: the
    ``min-copies`` policy (fewest copies per run first, then time); else time, with ``MARGIN``.
    """
    host = backends[-1].name
    current = {n: n.meta["device"] for n in graph.nodes}
    if any(n.meta["placement_reason"] == "pinned" for n in graph.nodes):
        return None
    # A placement on one device is compared too: priority put GPT-like's layer whole on the
    # NPU, estimated 3.87 ms against the CPU's 3.24, and nothing compared them. (Under
    # ``min-copies`` one device is already the fewest copies that device allows.)
    if by_copies and len(set(current.values())) < 2:
        return None
    mixed = estimate(graph, current, costs, host)
    if mixed.seconds is None and not by_copies:
        return None
    best = None
    for b in backends:
        if not all(capable(b, n) for n in graph.nodes):
            continue
        alone = estimate(graph, dict.fromkeys(graph.nodes, b.name), costs, host)
        if best is None or _rank(alone, by_copies) < _rank(best[1], by_copies):
            best = (b, alone)
    if best is None:
        return None
    if by_copies:
        return best + (mixed,) if _rank(best[1], True) < _rank(mixed, True) else None
    if best[1].seconds is None or best[1].seconds >= mixed.seconds * (1 - MARGIN):
        return None
    return best[0], best[1], mixed


def _rank(e: Estimate, by_copies: bool) -> tuple:
    seconds = float("inf") if e.seconds is None else e.seconds
    return (e.copies, seconds) if by_copies else (seconds,)
