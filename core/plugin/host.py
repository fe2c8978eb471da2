"""Plugin loading: pluggy, project ``anychip``, entry-point group ``anychip``.

``load_plugins()`` runs once per process, on first need (``anychip.load`` or
``anychip.devices``), never at import. Built-in backends are entry points of anychip's own
package, found the same way as third-party ones. Each plugin is imported, checked for the hook
API version it declares (``ANYCHIP_API_VERSION``), registered, and its hooks called; a plugin
that fails any step is recorded with the reason and skipped, and the host goes on.

Environment:
    ANYCHIP_DISABLE_PLUGINS: comma list of plugin names to skip, or ``*`` for every
        third-party plugin (built-ins stay).
    ANYCHIP_TRACE_PLUGINS: when set, each plugin load and hook call is logged at INFO level.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading
from typing import Any

import pluggy

from anychip.core.plugin import hookspecs
from anychip.core.plugin.registry import PluginRecord, Registry
from anychip.errors import PluginError

__all__ = [
    "load_plugins",
    "get_registry",
    "reset_plugins",
    "register_plugin",
    "unregister_plugin",
    "HOOK_ORDER",
]

log = logging.getLogger("anychip.plugins")

HOOK_ORDER = (
    "anychip_register_ops",
    "anychip_register_backends",
    "anychip_register_memory_pools",
    "anychip_register_kernels",
    "anychip_register_passes",
)
_BUILTIN = {
    "cpu": "anychip.backends.cpu",
    "xpu_stub": "anychip.backends.xpu_stub",
    "npu_stub": "anychip.backends.npu_stub",
}
_lock = threading.RLock()
_registry: Registry | None = None
_extra: list[tuple[str, Any]] = []


def _entry_points() -> list[tuple[str, str, Any]]:
    """(name, module path, loader) for every plugin: anychip's own, then third-party ones."""
    found: dict[str, tuple[str, str, Any]] = {}
    for name, module in _BUILTIN.items():
        found[name] = (name, module, None)
    for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
        if ep.name in _BUILTIN and ep.value == _BUILTIN[ep.name]:
            continue
        found.setdefault(ep.name, (ep.name, ep.value, ep))
    return list(found.values())


def _disabled() -> tuple[set[str], bool]:
    raw = os.environ.get("ANYCHIP_DISABLE_PLUGINS", "")
    names = {s.strip() for s in raw.split(",") if s.strip()}
    return names, "*" in names


def _import(name: str, module: str, ep: Any) -> Any:
    try:
        plugin = ep.load() if ep is not None else importlib.import_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        raise PluginError(
            f"plugin {name!r} ({module}) failed to import: {type(e).__name__}: {e}"
        ) from e
    version = getattr(plugin, "ANYCHIP_API_VERSION", None)
    if version is None:
        raise PluginError(
            f"plugin {name!r} ({module}) does not declare ANYCHIP_API_VERSION; add "
            f"`ANYCHIP_API_VERSION = {hookspecs.API_VERSION}` to the module it registers"
        )
    if version != hookspecs.API_VERSION:
        raise PluginError(
            f"plugin {name!r} ({module}) was written for anychip hook API {version}, but this "
            f"anychip provides API {hookspecs.API_VERSION}; upgrade the plugin or anychip"
        )
    return plugin


def load_plugins() -> Registry:
    """Import, register and call every plugin; returns the filled registry."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    registry = Registry()
    trace = bool(os.environ.get("ANYCHIP_TRACE_PLUGINS"))
    skip, skip_all = _disabled()
    candidates = _entry_points()
    candidates += [(n, getattr(obj, "__name__", repr(obj)), obj) for n, obj in _extra]
    for name, module, ep in candidates:
        if name in skip or (skip_all and name not in _BUILTIN):
            reason = "disabled by ANYCHIP_DISABLE_PLUGINS"
            registry.plugins.append(PluginRecord(name, module, False, reason))
            continue
        refused = _register(pm, name, module, ep)
        if refused is not None:
            registry.plugins.append(PluginRecord(name, module, False, refused))
            log.warning("%s", refused)
            continue
        if trace:
            log.info("anychip: loaded plugin %s (%s)", name, module)
        registry.plugins.append(PluginRecord(name, module, True))
    failed: set[str] = set()
    while (bad := _call_hooks(pm, registry, failed, trace)) is not None:
        # Removed whole: the registry is filled again by the others, so nothing the failed
        # plugin merged into another's tables (a kernel, a pool, a schema) stays behind.
        failed.add(bad[0])
        _record_failure(registry, *bad)
        registry.clear_contributions()
    registry.current_plugin = "?"
    return registry


def _register(pm: pluggy.PluginManager, name: str, module: str, ep: Any) -> str | None:
    """Import and register one plugin with ``pm``; the reason it was refused, or None."""
    try:
        if any(obj is ep for _, obj in _extra):
            plugin = ep
            _check_version(name, module, plugin)
        else:
            plugin = _import(name, module, ep)
        pm.register(plugin, name=name)
    except PluginError as e:
        return str(e)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        return f"plugin {name!r} ({module}) failed to register: {type(e).__name__}: {e}"
    msg = None
    if unknown := sorted(c.name for c in pm.get_hookcallers(plugin) or [] if c.spec is None):
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
    pm: pluggy.PluginManager, registry: Registry, failed: set[str], trace: bool
) -> tuple[str, str] | None:
    """Call every hook of the plugins not in ``failed``, plugin by plugin in lifecycle order;
    the first plugin whose hook raises (any exception but KeyboardInterrupt) stops the round:
    returns its name and why (None when every hook ran)."""
    for hook_name in HOOK_ORDER:
        caller = getattr(pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            if impl.plugin_name in failed:
                continue
            registry.current_plugin = impl.plugin_name
            if trace:
                log.info("anychip: %s.%s()", impl.plugin_name, hook_name)
            try:
                impl.function(registry=registry)
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                return impl.plugin_name, f"{hook_name} raised {type(e).__name__}: {e}"
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


def get_registry() -> Registry:
    """The process-wide registry, loading plugins on first call."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = load_plugins()
        return _registry


def reset_plugins() -> None:
    """Forget the loaded plugins; the next ``get_registry()`` loads them again (for tests)."""
    global _registry
    with _lock:
        _registry = None


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
