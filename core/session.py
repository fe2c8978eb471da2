"""``Session`` and ``load``: a model compiled for a set of devices, run like onnxruntime.

The session is the facade over two halves. ``core/compiler.py`` walks the model from its
schemas to compiled partitions on a copy of the caller's model (the walk is listed there);
``core/runner.py`` runs the resulting steps; ``core/feeds.py`` checks what goes in and out.
There is no CPU-only shortcut: one device is the general case with one partition.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from anychip.core.calibration import resolve_calibration_mode
from anychip.core.compiler import compile_model
from anychip.core.devices import resolve_devices
from anychip.core.feeds import Feeds, IOInfo, detach
from anychip.core.memory.report import MemoryReport, memory_report
from anychip.core.placement import PlacementOptions
from anychip.core.plugins import get_registry
from anychip.core.report import (
    CopyInfo,
    NodeRecord,
    PartitionRecord,
    PlacementReport,
    log_fallbacks,
)
from anychip.errors import AnychipError, DeviceError
from anychip.ir.graph import Model

__all__ = ["Session", "IOInfo", "load", "resolve_devices"]


class Session:
    """A model compiled for a list of devices. Use ``anychip.load`` to make one.

    ``model`` is the compiled copy (placement marks on its nodes); the caller's model is
    never modified. ``run`` is serialised by a lock (kernel contexts hold the running frame).
    """

    def __init__(
        self,
        model: Model,
        devices: list[str],
        options: PlacementOptions,
        device_options: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        plan_cache_size: int = 8,
        optimize: bool = True,
        check_kernels: bool = True,
    ) -> None:
        registry = get_registry()
        device_options = dict(device_options or {})
        unknown = sorted(set(device_options) - set(devices))
        if unknown:
            raise DeviceError(
                f"device_options name {unknown}, which are not among this "
                f"session's devices {devices}"
            )
        if int(plan_cache_size) < 1:
            raise AnychipError(f"plan_cache_size must be >= 1, got {plan_cache_size}")
        backends = [registry.backends[d].configure(**device_options.get(d, {})) for d in devices]
        #: What compilation produced (partitions, steps, memory): for inspection.
        self.compiled = c = compile_model(
            model,
            backends,
            options,
            registry,
            plan_cache_size=int(plan_cache_size),
            optimize=optimize,
            check_kernels=check_kernels,
        )
        self.model = c.model
        self.devices = devices
        self.options = options
        self.partitions, self.copies = c.partitions, c.copies
        self.folded, self.optimizations = c.folded, c.optimizations
        graph = c.model.graph
        self.inputs = [IOInfo(v) for v in graph.inputs]
        self.outputs = [IOInfo(v) for v in graph.outputs]
        self._feeds = Feeds(graph.inputs, graph.outputs)
        self._lock = threading.Lock()
        log_fallbacks(self.model.graph, devices)

    def get_inputs(self) -> list[IOInfo]:
        """The model's inputs (onnxruntime's spelling)."""
        return self.inputs

    def get_outputs(self) -> list[IOInfo]:
        """The model's outputs (onnxruntime's spelling)."""
        return self.outputs

    def placement(self) -> PlacementReport:
        """Which node runs where and why, the partitions, and the copies per run."""
        part_of = {n: p.index for p in self.partitions for n in p.nodes}
        nodes = [
            NodeRecord(n.name, n.op_type, n.meta["device"], n.meta["placement_reason"], part_of[n])
            for n in self.model.graph.nodes
        ]
        parts = [
            PartitionRecord(p.index, p.device, [n.name for n in p.nodes], dict(p.info))
            for p in self.partitions
        ]
        copies = [CopyInfo(c.tensor, c.src, c.dst, c.bytes) for c in self.copies]
        load_copies = list(self.compiled.load_copies)
        return PlacementReport(nodes, parts, copies, load_copies, self.devices)

    def memory(self) -> MemoryReport:
        """Memory figures per device: plan, lower bound, peak, reserved, plan cache (see
        ``core/memory/report.py``)."""
        return memory_report(self.compiled)

    def run(
        self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], run_options: Any = None
    ) -> list[Any]:
        """Run the model: ``feeds`` maps input names to arrays; returns the outputs as numpy.

        Raises:
            InputError: a feed is missing, unknown, or of the wrong dtype, rank or shape.
            KernelError: a kernel failed (the message names the node and device).
        """
        arrays = self._feeds.check(feeds)
        wanted = self._feeds.select(output_names)
        with self._lock:
            outs = self.compiled.steps.run(arrays)
        return [detach(outs[i], feeds) for i in wanted]

    def __repr__(self) -> str:
        return (
            f"<anychip.Session devices={self.devices} inputs={[i.name for i in self.inputs]}"
            f" outputs={self._feeds.output_names}>"
        )


def load(
    model: Any,
    devices: Sequence[str] | str | None = None,
    *,
    placement: dict[str, str] | None = None,
    strict: bool = False,
    max_copies: int | None = None,
    device_options: Mapping[str, Mapping[str, Any]] | None = None,
    cost_model: bool = True,
    plan_cache_size: int = 8,
    optimize: bool = True,
    check_kernels: bool = True,
    calibration: str | None = None,
    **options: Any,
) -> Session:
    """Compile a model for a set of devices.

    Args:
        model: a path to an ``.onnx`` file, its bytes, an ``onnx.ModelProto`` or an
            ``anychip.ir.Model``.
        devices: device names in priority order (``["npu", "cpu"]`` or ``"npu,cpu"``);
            default ``ANYCHIP_DEVICES``, else every available device, cpu last.
        placement: pins by node name, op type or glob on node names -> device.
        strict: fail instead of falling back to a later device.
        max_copies: fail when a run would copy more tensors between devices than this.
        device_options: per-device settings, e.g. ``{"npu": {"precision": "fp16"}}``.
        cost_model: let the cost model keep small islands off accelerators (default True).
        plan_cache_size: memory plans kept per partition for dynamic input shapes (default 8).
        optimize: run the graph optimizations before placement (default True): a Conv's
            BatchNormalization is folded into its weights, as onnxruntime's basic level does.
            False keeps every node as written (constant folding always runs).
        check_kernels: check each kernel's outputs against the dtype and shape inference
            declared (default True); a mismatch is a ``KernelError`` naming the kernel.
        calibration: where the cost model's figures come from: ``"auto"`` (default, or
            ``ANYCHIP_CALIBRATION``): each device measured on this machine, once, cached on
            disk (``anychip calibrate``); ``"cached"``: measured figures only where cached;
            ``"off"``: the backends' declared figures.

    Returns:
        A ``Session``; ``session.run(None, {"x": x})`` runs it.
    """
    if options:
        raise AnychipError(
            f"unknown load option(s) {sorted(options)}; known: devices, "
            "placement, strict, max_copies, device_options, cost_model, plan_cache_size, optimize, "
            "check_kernels, calibration"
        )
    from anychip.ir.onnx import import_model

    registry = get_registry()
    if not isinstance(model, Model):
        model = import_model(model, custom_schemas=registry.schemas)
    names = resolve_devices(devices, strict=strict)
    opts = PlacementOptions(
        pins=placement, strict=strict, max_copies=max_copies, cost_model=cost_model
    )
    opts.calibration = resolve_calibration_mode(calibration)
    return Session(
        model,
        names,
        opts,
        device_options,
        plan_cache_size=plan_cache_size,
        optimize=optimize,
        check_kernels=check_kernels,
    )
