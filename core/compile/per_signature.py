"""How a graph-mode partition is compiled when not once at load: per input signature or in
the background (``core/compile/specialize.py``'s ``SpecializedPartition`` over the host's
program), and the process's disk cache of compiled artifacts (one per cache folder).

Split from ``pipeline.py`` (the partition compile's other half), which re-exports
``disk_for``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anychip.core.compile.cache import DiskCache
from anychip.core.compile.specialize import SpecializedPartition, graph_key
from anychip.core.compile.static_shapes import all_static
from anychip.core.plan.partition import HOST, Partition
from anychip.core.run.program import Program
from anychip.paths import cache_root

if TYPE_CHECKING:
    from anychip.core.compile.pipeline import CompiledModel, CompileOptions

__all__ = ["disk_for", "process_disk", "specialized", "specializes", "static_key"]


def specializes(backend: Any, graph: Any, copts: CompileOptions, strict: bool = False) -> bool:
    """Whether a graph-mode partition is compiled per input signature (``specialize.py``):
    the device takes static shapes only and the partition's are symbolic, or it compiles in
    the background (a symbolic device only when it asks to, ``compiles_in_background``, and
    not under ``strict``: nothing of it may run on the host, so it compiles at load)."""
    if backend.shape_policy != "static":  # one dynamic compile, in the background if asked
        wants = bool(getattr(backend, "compiles_in_background", False))
        return copts.background_compile and wants and not strict
    static = all(v.is_static for v in graph.inputs)
    return not static or copts.background_compile


def specialized(
    out: CompiledModel,
    p: Partition,
    backend: Any,
    registry: Any,
    copts: CompileOptions,
    strict: bool = False,
) -> SpecializedPartition:
    """The partition as a ``SpecializedPartition`` over its host program (the CPU kernels);
    ``strict``: a signature whose compile failed raises instead of running on the host."""
    host = registry.backends[HOST]
    program = Program(
        p.graph, host, registry.kernel_table(HOST), registry.schemas, check_kernels=False
    )
    sp = SpecializedPartition(
        p.graph,
        backend,
        program,
        cache_size=copts.compile_cache_size,
        background=copts.background_compile,
        info=p.info,
        disk=process_disk(copts),
        strict=strict,
        dynamic=backend.shape_policy != "static",
        timeout=copts.compile_timeout,
        what=f"compile of partition {p.index} on {p.device}",
    )
    p.info["shapes"] = "compiled per input signature"
    if sp.dynamic:
        p.info["shapes"] = "dynamic (one compile for every shape, in the background)"
    # With the background compile a static partition is compiled after its first run (which
    # the host serves at full speed: a compile beside it would slow it down); without, now.
    if all_static(p.graph) and not copts.background_compile:
        sp.compile(static_key(p.graph), None)
    return sp


def static_key(graph: Any) -> tuple:
    """The input signature of a partition whose inputs have static shapes (symbols as they
    are, for a symbolic device: ``specialize.graph_key``)."""
    return graph_key(graph)


_DISKS: dict[str, DiskCache] = {}


def disk_for(copts: CompileOptions) -> DiskCache | None:
    """The disk cache of compiled artifacts ``copts`` uses (None: off)."""
    return process_disk(copts)


def process_disk(copts: CompileOptions) -> DiskCache | None:
    """The process's disk cache of compiled artifacts (one per cache folder), or None."""
    if not copts.disk_cache:
        return None
    root = str(cache_root())
    disk = _DISKS.get(root)
    if disk is None:  # setdefault: one per folder, whatever the threads
        disk = _DISKS.setdefault(root, DiskCache())
    return disk
