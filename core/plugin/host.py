"""Plugin loading: pluggy, project ``anychip``, entry-point group ``anychip``; a plugin is
imported when a session first needs a device it provides, never at ``import anychip``.

Discovery reads entry-point metadata and imports nothing (``core/plugin/discovery.py``): an
entry point's name is the device kind(s) its plugin provides (``npu = "anychip_npu"``,
``"vulkan+metal" = ...``, ``"cpu.myops" = ...`` for a plugin adding to the cpu).
``get_registry(devices)`` then imports and registers plugins in batches, as pytest does, but
only those a request needs:

* ``get_registry(["npu", "cpu"])`` (``anychip.load(m, devices=[...])``, ``ANYCHIP_DEVICES``):
  the cpu's plugins (always: the cpu is every session's fallback) and the plugins whose name
  declares kind ``npu``. A device none of the imported plugins provides (``toy`` from a plugin
  named ``toychip``) imports all the others before the session calls the device unknown.
* ``get_registry()`` (``anychip.devices()``, ``anychip devices``, ``anychip.load`` without
  devices, which takes every available one): every plugin.
* Objects added with ``register_plugin`` (imported already) join the first batch.

Each plugin is imported, checked for the hook API version it declares (``ANYCHIP_API_VERSION``),
registered, and its hooks called plugin by plugin in lifecycle order (``HOOK_ORDER``) within its
batch. A plugin that fails any step is recorded with the reason (``anychip devices`` lists it)
and skipped, and the host goes on: the registry returns to what it held before the batch and
the batch's other plugins' hooks run again, so nothing the failed plugin added stays (a kernel
it merged into the cpu's table included). Otherwise the registry only grows: a backend in use
is never made again. A later batch's hooks run after the earlier batches' (a plugin's schemas
may come after another's kernels); lookups by name see each batch whole (it is added under the
host's lock).

Environment:
    ANYCHIP_DISABLE_PLUGINS: comma list of plugin names to skip, or ``*`` for every
        third-party plugin (built-ins stay). The stubs' old names ``npu_stub``, ``xpu_stub``
        still work.
    ANYCHIP_TRACE_PLUGINS: when set, each batch, plugin load and hook call is logged at INFO
        level.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

import pluggy

from anychip.core.plugin import hookspecs
from anychip.core.plugin.discovery import Candidate, device_kind, disabled, discover
from anychip.core.plugin.registry import PluginRecord, Registry
from anychip.errors import PluginError

__all__ = [
    "load_plugins",
    "get_registry",
    "reset_plugins",
    "register_plugin",
    "unregister_plugin",
    "HOOK_ORDER",
    "FALLBACK",
]

log = logging.getLogger("anychip.plugins")

HOOK_ORDER = (
    "anychip_register_ops",
    "anychip_register_backends",
    "anychip_register_memory_pools",
    "anychip_register_kernels",
    "anychip_register_passes",
)
#: The device kind whose plugins every request imports: everything unclaimed runs there.
FALLBACK = "cpu"
_lock = threading.RLock()
_loader: _Loader | None = None
_extra: list[tuple[str, Any]] = []


def _import(c: Candidate) -> Any:
    try:
        plugin = c.loader.load() if c.loader is not None else importlib.import_module(c.module)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        raise PluginError(
            f"plugin {c.name!r} ({c.module}) failed to import: {type(e).__name__}: {e}"
        ) from e
    version = getattr(plugin, "ANYCHIP_API_VERSION", None)
    if version is None:
        raise PluginError(
            f"plugin {c.name!r} ({c.module}) does not declare ANYCHIP_API_VERSION; add "
            f"`ANYCHIP_API_VERSION = {hookspecs.API_VERSION}` to the module it registers"
        )
    _check_version(c.name, c.module, plugin)
    return plugin


class _Loader:
    """One set of plugins: the pluggy manager, the registry, and the plugins not imported yet."""

    def __init__(self, candidates: list[Candidate]) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.registry = Registry()
        self.pending: list[Candidate] = []
        self.trace = bool(os.environ.get("ANYCHIP_TRACE_PLUGINS"))
        skip, skip_all = disabled()
        for c in candidates:
            if c.name in skip or (skip_all and not c.builtin):
                reason = "disabled by ANYCHIP_DISABLE_PLUGINS"
                self.registry.plugins.append(PluginRecord(c.name, c.module, False, reason))
            else:
                self.pending.append(c)

    def load_for(self, devices: Iterable[str] | None) -> None:
        """Import the plugins ``devices`` need (every one when None)."""
        if not self.pending:
            return
        if devices is None:
            self.load(self.pending, "every device")
            return
        devices = [d.strip().lower() for d in devices]
        kinds = {device_kind(d) for d in devices} | {FALLBACK}
        self.load(
            [c for c in self.pending if c.in_process or c.kinds & kinds],
            f"device kinds {', '.join(sorted(kinds))}",
        )
        missing = [d for d in devices if d not in self.registry.backends]
        if missing and self.pending:
            # A plugin's name need not be its device's kind: only the others can tell.
            self.load(self.pending, f"{', '.join(missing)}, which no imported plugin provides")

    def load(self, batch: list[Candidate], why: str) -> None:
        """Import, register and call the hooks of ``batch`` (plugins from ``pending``)."""
        if not batch:
            return
        batch = list(batch)
        self.pending = [c for c in self.pending if c not in batch]
        if self.trace:
            log.info("anychip: loading plugins %s for %s", [c.name for c in batch], why)
        registry = self.registry
        before = registry.snapshot()
        names = []
        for c in batch:
            refused = _register(self.pm, c)
            if refused is not None:
                registry.plugins.append(PluginRecord(c.name, c.module, False, refused))
                log.warning("%s", refused)
                continue
            if self.trace:
                log.info("anychip: loaded plugin %s (%s)", c.name, c.module)
            registry.plugins.append(PluginRecord(c.name, c.module, True))
            names.append(c.name)
        failed: set[str] = set()
        while (bad := _call_hooks(self.pm, registry, names, failed, self.trace)) is not None:
            # Back to the registry before this batch, and the batch's others again: nothing the
            # failed plugin merged into another's tables (a kernel, a pool, a schema) stays.
            failed.add(bad[0])
            _record_failure(registry, *bad)
            registry.restore(before)
        for name in failed:
            self.pm.unregister(name=name)
        registry.current_plugin = "?"


def load_plugins() -> Registry:
    """Import, register and call every plugin into a new registry (not the process-wide one
    ``get_registry`` keeps); returns it."""
    loader = _Loader(discover(_extra))
    loader.load_for(None)
    return loader.registry


def _register(pm: pluggy.PluginManager, c: Candidate) -> str | None:
    """Import and register one plugin with ``pm``; the reason it was refused, or None."""
    name, module = c.name, c.module
    try:
        if c.in_process:
            plugin = c.loader
            _check_version(name, module, plugin)
        else:
            plugin = _import(c)
        pm.register(plugin, name=name)
    except PluginError as e:
        return str(e)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        return f"plugin {name!r} ({module}) failed to register: {type(e).__name__}: {e}"
    msg = None
    if unknown := sorted(h.name for h in pm.get_hookcallers(plugin) or [] if h.spec is None):
        # One plugin's typo must not fail every load: it alone is left out.
        msg = (
            f"plugin {name!r} ({module}) implements {', '.join(unknown)}, which anychip "
            f"does not define; the hooks are {', '.join(HOOK_ORDER)}"
        )
    elif not pm.get_hookcallers(plugin):
        # Without @hookimpl pluggy sees no hook at all: the plugin would vanish silently.
        msg = (
            f"plugin {name!r} ({module}) registers no hook: decorate its functions "
            "anychip_register_* with @anychip.hookimpl"
        )
    if msg is not None:
        pm.unregister(plugin)
    return msg


def _call_hooks(
    pm: pluggy.PluginManager, registry: Registry, names: list[str], failed: set[str], trace: bool
) -> tuple[str, str] | None:
    """Call every hook of the plugins in ``names`` but not in ``failed``, plugin by plugin in
    lifecycle order; the first plugin whose hook raises (any exception but KeyboardInterrupt)
    stops the round: returns its name and why (None when every hook ran)."""
    for hook_name in HOOK_ORDER:
        caller = getattr(pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            if impl.plugin_name not in names or impl.plugin_name in failed:
                continue
            registry.current_plugin = impl.plugin_name
            if trace:
                log.info("anychip: %s.%s()", impl.plugin_name, hook_name)
            _in_hook.where = (impl.plugin_name, hook_name)
            try:
                impl.function(registry=registry)
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                return impl.plugin_name, f"{hook_name} raised {type(e).__name__}: {e}"
            finally:
                _in_hook.where = None
    return None


def _check_version(name: str, module: str, plugin: Any) -> None:
    version = getattr(plugin, "ANYCHIP_API_VERSION", hookspecs.API_VERSION)
    if version != hookspecs.API_VERSION:
        raise PluginError(
            f"plugin {name!r} ({module}) was written for anychip hook API {version}, but this "
            f"anychip provides API {hookspecs.API_VERSION}; upgrade the plugin or anychip"
        )


def _record_failure(registry: Registry, plugin: str, why: str) -> None:
    for rec in registry.plugins:
        if rec.name == plugin:
            rec.ok = False
            rec.error = f"plugin {plugin!r}: {why}; it is left out whole"
            log.warning("%s", rec.error)


#: The plugin whose hook this thread is running, if any (``_call_hooks``).
_in_hook = threading.local()


def get_registry(devices: Iterable[str] | None = None) -> Registry:
    """The process-wide registry, with the plugins ``devices`` need imported and registered
    (the cpu's always; every plugin when ``devices`` is None). Cheap once they are.

    Raises:
        PluginError: called from a plugin's hook (``anychip.devices()`` or ``anychip.load``
            inside ``anychip_register_*``): the registry is half made there, and loading
            again from inside the load recursed and left other plugins blamed (issue 47).
    """
    global _loader
    hook = getattr(_in_hook, "where", None)
    if hook is not None:
        raise PluginError(
            f"plugin {hook[0]!r} called back into anychip (anychip.devices(), anychip.load or "
            f"get_registry) from its hook {hook[1]}, while the plugins are being loaded; a "
            "hook may only register into the registry it is given: move that call out of "
            "the hook (into the backend's methods, which run after loading)"
        )
    with _lock:
        if _loader is None:
            _loader = _Loader(discover(_extra))
        _loader.load_for(devices)
        return _loader.registry


def reset_plugins() -> None:
    """Forget the loaded plugins; the next ``get_registry()`` loads them again (for tests)."""
    global _loader
    with _lock:
        _loader = None


def register_plugin(plugin: Any, name: str) -> None:
    """Add a plugin object without packaging it (tests, notebooks); takes effect on reload."""
    with _lock:
        _extra.append((name, plugin))
        reset_plugins()


def unregister_plugin(name: str) -> None:
    """Remove a plugin added with ``register_plugin``."""
    with _lock:
        _extra[:] = [(n, p) for n, p in _extra if n != name]
        reset_plugins()
