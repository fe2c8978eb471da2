"""``Registry``: what plugins add through their hooks, in one place.

Invariants:
    * One registry per process (``core/plugin/host.py``), filled batch by batch as sessions
      ask for devices. It only grows, except when a plugin of the batch being loaded fails:
      ``restore`` then takes it back to its ``snapshot`` from before the batch, in place.
    * Every item remembers the plugin that added it (``origin``), so errors and reports can
      name the plugin.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from anychip.core.plugin.kernels import KernelTable
from anychip.errors import PluginError
from anychip.ir.passes import Pass, PassResult
from anychip.opsets.schemas import OpSchema, SchemaRegistry

if TYPE_CHECKING:
    from anychip.core.plugin.backend import Backend

__all__ = ["Registry", "PassEntry", "PluginRecord"]


class _CallablePass(Pass):
    """An old-style pass, ``fn(graph)`` returning whether it changed the graph (or nothing)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    @property
    def name(self) -> str:
        return str(getattr(self.fn, "name", None) or getattr(self.fn, "__name__", repr(self.fn)))

    def call(self, graph: Any) -> PassResult:
        changed = self.fn(graph)
        return PassResult(graph, True if changed is None else bool(changed))


class PassEntry:
    """A registered graph pass and where it runs."""

    __slots__ = ("pass_", "backend", "stage", "origin")

    def __init__(self, pass_: Any, backend: str | None, stage: str, origin: str) -> None:
        self.pass_ = pass_
        self.backend = backend
        self.stage = stage
        self.origin = origin


class PluginRecord:
    """One plugin as loaded (or not): its name, origin, and the error if it failed."""

    __slots__ = ("name", "module", "ok", "error")

    def __init__(self, name: str, module: str, ok: bool, error: str = "") -> None:
        self.name = name
        self.module = module
        self.ok = ok
        self.error = error

    def __repr__(self) -> str:
        state = "ok" if self.ok else f"failed: {self.error}"
        return f"PluginRecord({self.name!r}, {state})"


class Registry:
    """Backends, kernels, passes, memory pools and schemas contributed by plugins."""

    def __init__(self) -> None:
        self.backends: dict[str, Backend] = {}
        self.kernels: dict[str, KernelTable] = {}
        self.passes: list[PassEntry] = []
        self.pools: dict[str, Callable[[Backend], Any]] = {}
        self.schemas = SchemaRegistry()
        self.plugins: list[PluginRecord] = []
        self.current_plugin = "?"

    def snapshot(self) -> tuple[Any, ...]:
        """What plugins have contributed so far (not the plugin records), for ``restore``."""
        tables = {name: (t, t.snapshot()) for name, t in self.kernels.items()}
        return (
            dict(self.backends),
            tables,
            list(self.passes),
            dict(self.pools),
            self.schemas.snapshot(),
        )

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Go back to ``snapshot``: later backends, kernels, passes, pools and schemas are
        forgotten; the kernel tables and schema registry objects stay the same (sessions hold
        them), their contents go back."""
        backends, tables, passes, pools, schemas = snapshot
        for table, kernels in tables.values():
            table.restore(kernels)
        self.backends = dict(backends)
        self.kernels = {name: table for name, (table, _) in tables.items()}
        self.passes = list(passes)
        self.pools = dict(pools)
        self.schemas.restore(schemas)

    # -- what hooks call -----------------------------------------------------------------------
    def add_backend(self, backend: Backend) -> None:
        """Register a device backend under ``backend.name``."""
        if backend.name in self.backends:
            prev = self.backends[backend.name]
            raise PluginError(
                f"plugin {self.current_plugin!r} registers backend {backend.name!r}, which "
                f"plugin {prev.origin!r} already registered; pick another name"
            )
        backend.origin = self.current_plugin
        backend.registry = self
        self.backends[backend.name] = backend

    def add_kernels(self, table: KernelTable) -> None:
        """Register the kernels of ``table`` for backend ``table.backend``."""
        have = self.kernels.get(table.backend)
        if have is None:
            self.kernels[table.backend] = merged = KernelTable(table.backend)
            merged.merge(table)
        elif have is not table:
            have.merge(table)

    def add_pass(self, pass_: Any, *, backend: str | None = None, stage: str = "generic") -> None:
        """Register a graph pass for the whole graph (backend None) or one backend.

        ``pass_`` is an ``anychip.ir.passes.Pass`` (``call(graph) -> PassResult``). A plain
        callable ``fn(graph)`` still works, wrapped, with a ``DeprecationWarning``.
        """
        if not isinstance(pass_, Pass):
            if not callable(pass_):
                raise PluginError(
                    f"plugin {self.current_plugin!r} registers {pass_!r} as a pass; a pass is "
                    "an anychip.ir.passes.Pass subclass instance"
                )
            warnings.warn(
                f"plugin {self.current_plugin!r}: registering the plain callable {pass_!r} as a "
                "pass is deprecated; subclass anychip.ir.passes.Pass and return "
                "PassResult(graph, modified) from call(graph)",
                DeprecationWarning,
                stacklevel=2,
            )
            pass_ = _CallablePass(pass_)
        self.passes.append(PassEntry(pass_, backend, stage, self.current_plugin))

    def add_pool(self, kind: str, factory: Callable[[Backend], Any]) -> None:
        """Register the memory pool factory for device kind ``kind`` (last one wins)."""
        self.pools[kind] = factory

    def add_schema(self, schema: OpSchema) -> None:
        """Register the schema of a custom-domain operator."""
        self.schemas.add(schema)

    # -- what the runtime reads ----------------------------------------------------------------
    def kernel_table(self, backend: str) -> KernelTable:
        table = self.kernels.get(backend)
        if table is None:  # setdefault: two threads asking first get one table
            table = self.kernels.setdefault(backend, KernelTable(backend))
        return table

    def passes_for(self, backend: str | None) -> list[PassEntry]:
        return [p for p in self.passes if p.backend == backend]
