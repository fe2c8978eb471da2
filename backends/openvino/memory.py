"""Memory figures of an OpenVINO device, as far as OpenVINO lets them be known.

OpenVINO does not report the memory of a CPU compiled model, so the figures are anychip's:

* ``HeldWeights``: the bytes of weights OpenVINO holds for the partitions alive on a device
  (it keeps its own copy of every constant it read), counted when a partition is compiled or
  loaded and given back when its executable is collected. ``Session.memory()`` shows them as
  the device's reserved and peak bytes, and the conformance kit checks they return to zero.
* ``activation_lower_bound``: the most bytes of a partition's intermediate tensors live at
  one step of its graph (static shapes only), the bound no executor's plan can beat; OpenVINO
  plans its own buffers, out of sight, and needs at least this much. It is shown per partition
  (``activations_at_least`` in the placement report), not as a plan in the memory table.
* ``capacity``: the host's memory for the CPU, ``<FAMILY>_DEVICE_TOTAL_MEM_SIZE`` where a GPU
  or NPU plugin reports it.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from anychip.core.memory import MemoryStats

if TYPE_CHECKING:
    from anychip.ir.graph import Graph

__all__ = ["HeldWeights", "activation_lower_bound", "capacity", "weights_bytes"]


def weights_bytes(graph: Graph) -> int:
    """Bytes of ``graph``'s constants."""
    return sum(int(v.const.nbytes) for v in graph.initializers.values() if v.const is not None)


def activation_lower_bound(graph: Graph) -> int | None:
    """The most bytes of intermediate tensors live at once, or None where a shape is dynamic."""
    from anychip.core.memory import Step, lifetimes
    from anychip.core.memory.planner import MemoryPlanError, lower_bound

    steps, sizes = [], {}
    for node in graph.nodes:
        reads = tuple(v.name for v in node.inputs if v is not None and v.const is None)
        writes = tuple(v.name for v in node.outputs if v is not None)
        steps.append(Step(reads, writes))
        for v in node.outputs:
            if v is not None:
                if v.nbytes is None:
                    return None
                sizes[v.name] = int(v.nbytes)
    try:
        tensors = lifetimes(
            steps,
            sizes,
            inputs=[v.name for v in graph.inputs] + list(graph.initializers),
            outputs=[v.name for v in graph.outputs],
        )
    except MemoryPlanError:
        return None
    return lower_bound(tensors)


def capacity(family: str, device: str) -> int | None:
    """The device's memory in bytes, where known."""
    if family == "CPU":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    from anychip.backends.openvino.driver import core

    try:
        return int(core().get_property(device, f"{family}_DEVICE_TOTAL_MEM_SIZE"))
    except Exception:  # a plugin without the property: unknown
        return None


class HeldWeights:
    """The weights OpenVINO holds on one device, partition by partition (thread-safe)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.in_use = 0
        self.peak = 0
        self.allocs = 0
        self.frees = 0
        self._lock = threading.Lock()

    def hold(self, owner: Any, nbytes: int) -> None:
        """Count ``nbytes`` until ``owner`` (an executable) is collected."""
        with self._lock:
            self.in_use += nbytes
            self.peak = max(self.peak, self.in_use)
            self.allocs += 1
        weakref.finalize(owner, self._release, nbytes)

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self.in_use -= nbytes
            self.frees += 1

    def stats(self, capacity: int | None) -> MemoryStats:
        with self._lock:
            return MemoryStats(
                device=self.device,
                capacity=capacity,
                in_use=self.in_use,
                requested=self.in_use,
                peak=self.peak,
                reserved=self.in_use,
                alloc_count=self.allocs,
                free_count=self.frees,
                fragmentation=0.0,
                largest_free=0,
            )
