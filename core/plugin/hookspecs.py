"""The plugin author's manual: every hook anychip calls, grouped by lifecycle.

A plugin is a module (or object) with functions named like these hooks, marked with
``anychip.hookimpl``, and a module attribute ``ANYCHIP_API_VERSION`` naming the hook API it
was written for (this file's ``API_VERSION``). It is found through the ``anychip`` entry-point
group of its package::

    [project.entry-points.anychip]
    mychip = "anychip_mychip"

Every hook receives a registry and adds to it, so a hook is a line or two. Hooks are called in
the order below, once per process, when a session first needs a device the plugin provides
(its entry-point name is that device kind: ``core/plugin/discovery.py``), never at import.
A plugin whose import or hook raises is reported by ``anychip devices`` and skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from anychip.core.plugin.registry import Registry

__all__ = ["hookspec", "hookimpl", "API_VERSION", "PROJECT"]

PROJECT = "anychip"
API_VERSION = 1
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- 1. operators ------------------------------------------------------------------------------
@hookspec
def anychip_register_ops(registry: Registry) -> None:
    """Add abstract operator schemas of custom domains.

    Call ``registry.add_schema(onnx.defs.OpSchema(...))`` for each operator of your own domain
    (ONNX's domains are off limits). Nodes of a domain nobody registered are rejected at load
    time with the domain's name.
    """


# -- 2. devices --------------------------------------------------------------------------------
@hookspec
def anychip_register_backends(registry: Registry) -> None:
    """Add ``Backend`` objects (see ``core/plugin/backend.py``):
    ``registry.add_backend(MyBackend())``.

    A backend that is not usable on this machine still registers, and answers ``available()``
    with ``(False, "why")``; ``anychip devices`` shows the reason.
    """


@hookspec
def anychip_register_memory_pools(registry: Registry) -> None:
    """Add or replace the memory pool factory of a device kind.

    ``registry.add_pool("npu", factory)`` where ``factory(backend) -> MemoryPool``. The last
    registration for a kind wins, so a plugin can replace a built-in pool.
    """


# -- 3. kernels and passes ---------------------------------------------------------------------
@hookspec
def anychip_register_kernels(registry: Registry) -> None:
    """Add kernels: ``registry.add_kernels(table)`` with a ``KernelTable`` for one backend name.

    Kernels of a table named after an existing backend extend (and, for equal versions,
    override) that backend's kernels.
    """


@hookspec
def anychip_register_passes(registry: Registry) -> None:
    """Add graph passes: ``registry.add_pass(pass_obj, backend=None, stage="generic")``.

    ``backend=None`` runs on the whole graph before placement; a backend name runs the pass on
    that backend's partitions after partitioning (fusions, layout changes).
    """
