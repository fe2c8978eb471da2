"""A compiled partition checked before it is used: run on seeded random inputs and compared
with anychip's CPU kernels on the same inputs (``probe.reference``).

The node probes (``probe.py``) measure each node alone; a partition fuses them, and a fused
kernel can differ where each node alone did not. So every partition is run once at compile
time; a mismatch raises ``DeviceError`` and the runtime re-places the partition's nodes (the
placement report says so). Where the CPU reference raises on random inputs (an index input
out of its range), the check says so in the report and relies on the node probes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anychip.backends.iree.probe import compare, measured, reference
from anychip.errors import DeviceError

if TYPE_CHECKING:
    from anychip.ir.graph import Graph

__all__ = ["check_first_run", "check_partition"]


def check_partition(backend: Any, graph: Graph, exe: Any, what: str) -> str:
    """``"matched the CPU"`` or why it could not be checked.

    Raises:
        DeviceError: the executable computes differently from the CPU (it is closed first).
    """
    if any(v.shape is None for v in graph.inputs):
        return "not checked: an input of unknown rank"
    try:
        arrays, want = measured(graph, 17, backend.cpu_table(), backend.schemas())
    except Exception as e:
        return f"not checked: the CPU raised {type(e).__name__} on random inputs"
    try:
        got = [backend.to_host(t) for t in exe.run([backend.to_device(a) for a in arrays])]
    except Exception as e:
        exe.close()
        raise DeviceError(f"{what}: failed on random inputs: {str(e)[:300]}") from e
    for v, g, w in zip(graph.outputs, got, want):
        why = compare(g, w)
        if why is not None:
            exe.close()
            raise DeviceError(f"{what}: output {v.name!r} {why}; its nodes go to the next device")
    return "matched the CPU"


def check_first_run(
    backend: Any, graph: Graph, inputs: list[Any], outputs: list[Any], what: str
) -> None:
    """The first real run of a partition compared with the CPU on the same inputs.

    Random inputs cannot prove a compiled partition right (on lavapipe, GPT-2's masked
    attention matched on random inputs and not on the model's), so the first run is checked
    too; a mismatch raises and the runtime fails the device over, running the request again
    without it (the placement report's first line says so).

    Raises:
        DeviceError: an output differs from the CPU's.
    """
    arrays = [backend.to_host(t) for t in inputs]
    try:
        want = reference(graph, arrays, backend.cpu_table(), backend.schemas())
    except Exception:  # the CPU cannot run these inputs either: nothing to compare
        return
    for v, got, w in zip(graph.outputs, outputs, want):
        why = compare(backend.to_host(got), w)
        if why is not None:
            raise DeviceError(
                f"{what}: on its first real inputs, output {v.name!r} {why} (it matched on "
                "random ones); the device is failed over to the next"
            )
