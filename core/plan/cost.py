"""The cost model: rough time of a node on a device, and of the copies an island needs.

Where the device was calibrated on this machine (``core/plan/calibration.py``), a node's time is
read from the measured points of its op class at its work (elements, or FLOPs for MatMul and
Conv), and a copy's from the measured link latency and bandwidth. Otherwise the backend's
declared ``DeviceModel`` is the prior: time of a node = FLOPs / ``flops`` + bytes touched /
``mem_bandwidth`` + ``launch_overhead``; time of a copy = bytes / ``host_link`` + the launch
overhead of the copy.

The rule placement applies (``avoid_costly_islands``): a connected group of nodes placed on an
accelerator (an *island*) whose estimated saving over the fallback device is smaller than the
cost of the copies it forces, plus ``MIN_ISLAND_GAIN`` seconds, moves to the fallback device.
Nodes whose shapes are unknown have no estimate; islands containing them stay where priority
put them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from anychip.core.plan.calibration import op_class, op_key

if TYPE_CHECKING:
    from anychip.core.plan.calibration import Calibration
    from anychip.core.plugin.backend import DeviceModel
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = ["node_flops", "node_time", "measured_key", "copy_time", "MIN_ISLAND_GAIN"]

#: An island must save at least this many seconds more than its copies cost (1 microsecond).
MIN_ISLAND_GAIN = 1e-6


def _numel(v: Value | None) -> int | None:
    if v is None or not v.is_static:
        return None
    return math.prod(v.shape)


def node_flops(node: Node) -> float | None:
    """Floating-point operations of ``node``, or None when shapes are unknown."""
    out = _numel(node.outputs[0]) if node.outputs else None
    if out is None:
        return None
    op = node.op_type
    if op in ("Conv", "ConvTranspose") and len(node.inputs) > 1:
        w = node.inputs[1]
        if w is None or not w.is_static:
            return None
        per_out = math.prod(w.shape[1:])
        return 2.0 * out * per_out
    if op in ("MatMul", "Gemm") and node.inputs[0] is not None and node.inputs[0].is_static:
        a = node.inputs[0].shape
        k = a[0] if op == "Gemm" and node.attr("transA", 0) else a[-1]
        return 2.0 * out * k
    return float(out)


def node_bytes(node: Node) -> int | None:
    total = 0
    for v in list(node.inputs) + list(node.outputs):
        if v is None:
            continue
        b = v.nbytes
        if b is None:
            return None
        total += b
    return total


def _const_weight(node: Node) -> bool:
    """Whether ``node`` multiplies by a constant second operand (a layer's weight)."""
    return len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].const is not None


#: Data movement that copies contiguous runs (whole rows or blocks), priced by ``data_rows``.
_ROW_COPIES = frozenset({"Concat", "Split", "Slice"})


def _keeps_rows(node: Node) -> bool:
    """A Transpose whose permutation keeps the last axis (rows of at least 8 elements are
    moved whole, as in attention's head splits), or a Concat, Split or Slice (contiguous
    blocks): priced by the ``data_rows`` class, not by the 2-D transpose of ``data``."""
    if node.op_type in _ROW_COPIES:
        return True
    if node.op_type != "Transpose" or not node.inputs or node.inputs[0] is None:
        return False
    shape = node.inputs[0].shape
    perm = node.attr("perm", None)
    if not shape or perm is None or not isinstance(shape[-1], int):
        return False
    return list(perm)[-1] == len(shape) - 1 and shape[-1] >= 8


def measured_key(node: Node, cal: Calibration) -> str | None:
    """The calibration key ``node_time`` reads ``node`` from (None: not measured)."""
    key = op_key(node.op_type)
    if key and cal.points.get(key):  # the op's own points
        return key
    cls = op_class(node.op_type, _const_weight(node), _keeps_rows(node))
    if cal.points.get(cls):
        return cls
    if cls == "data_rows" and cal.points.get("data"):  # its probe did not run on the device
        return "data"
    return None


def node_time(node: Node, device: DeviceModel, cal: Calibration | None = None) -> float | None:
    """Estimated seconds for ``node`` on ``device`` (measured where ``cal`` has its op class),
    or None when shapes are unknown."""
    flops = node_flops(node)
    if flops is None:
        return None
    key = None if cal is None else measured_key(node, cal)
    if key is not None and cal is not None:
        measured = cal.time(key, flops)
        if measured is not None:
            return measured
    nbytes = node_bytes(node)
    if nbytes is None:
        return None
    return flops / device.flops + nbytes / device.mem_bandwidth + device.launch_overhead


def copy_time(nbytes: int | None, device: DeviceModel, cal: Calibration | None = None) -> float:
    """Estimated seconds to move ``nbytes`` between host and ``device``."""
    if device.host_link is None:
        return 0.0
    if cal is not None and cal.link is not None:
        return cal.copy_time(nbytes or 0)
    return (nbytes or 0) / device.host_link + device.launch_overhead
