"""Finding plugins without importing them, and the device kinds each one provides.

A plugin is found in one of three places, in this order: anychip's own backends (also when
anychip runs uninstalled), the ``anychip`` entry-point group of the installed distributions
(read from their metadata: nothing is imported), and the objects added in-process with
``host.register_plugin``. The host (``core/plugin/host.py``) imports a plugin only when a
session asks for a device it provides.

The entry-point name is the plugin's name and says which device kinds it provides, so that
anychip knows whom to import for a device without importing anyone::

    [project.entry-points.anychip]
    npu = "anychip_npu"                 # provides devices of kind npu (npu, npu:1...)
    "vulkan+metal" = "anychip_gfx"      # several kinds, joined by "+"
    "cpu.myops" = "anychip_myops"       # adds kernels or passes to the cpu: loaded with it

A device's kind is its name up to the first ``:`` (``opencl:1`` is of kind ``opencl``), and a
name part's kind is the part up to the first ``.`` (the rest keeps plugin names unique). A
plugin whose name is no device kind it provides (an older ``toychip`` providing ``toy``) still
works: it is imported when a device no imported plugin provides is asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

__all__ = [
    "BUILTIN",
    "LEGACY_NAMES",
    "Candidate",
    "device_kind",
    "plugin_kinds",
    "discover",
    "disabled",
]

GROUP = "anychip"
#: anychip's own plugins: always found, installed or not (name -> module).
BUILTIN = {
    "cpu": "anychip.backends.cpu",
    "xpu": "anychip.backends.xpu_stub",
    "npu": "anychip.backends.npu_stub",
    "ort": "anychip.backends.ort",  # onnxruntime's providers; inert without onnxruntime
    "openvino": "anychip.backends.openvino",  # OpenVINO's devices; unavailable without it
    # IREE's targets; unavailable without iree-base-compiler/-runtime
    "vulkan+iree-cpu+iree-cuda+iree-hip+iree-metal": "anychip.backends.iree",
}
#: The entry-point names of anychip's stubs before names were device kinds: an installed copy's
#: metadata may still carry them (the module is what identifies a built-in), and
#: ``ANYCHIP_DISABLE_PLUGINS`` still takes them.
LEGACY_NAMES = {"npu_stub": "npu", "xpu_stub": "xpu"}


class Candidate:
    """A plugin found but not imported yet.

    ``loader`` is the entry point to load (``importlib.metadata.EntryPoint`` or its cached
    form, ``entry_points.CachedEntryPoint``), the plugin object itself for
    an in-process plugin, or None for a built-in (imported by module name).
    """

    __slots__ = ("name", "module", "loader", "kinds", "builtin", "in_process")

    def __init__(
        self,
        name: str,
        module: str,
        loader: Any,
        *,
        builtin: bool = False,
        in_process: bool = False,
    ) -> None:
        self.name = name
        self.module = module
        self.loader = loader
        self.kinds = plugin_kinds(name)
        self.builtin = builtin
        self.in_process = in_process

    def __repr__(self) -> str:
        return f"Candidate({self.name!r}, {self.module!r})"


def device_kind(device: str) -> str:
    """The kind of a device name: ``opencl:1`` -> ``opencl``, ``NPU`` -> ``npu``."""
    return device.split(":", 1)[0].strip().lower()


def plugin_kinds(name: str) -> frozenset[str]:
    """The device kinds a plugin name declares: ``"vulkan+metal"`` -> {vulkan, metal},
    ``"cpu.myops"`` -> {cpu}."""
    parts = (p.split(".", 1)[0].strip().lower() for p in name.split("+"))
    return frozenset(p for p in parts if p)


def _installed() -> list[Any]:
    """The ``anychip`` entry points of the installed distributions (metadata only; kept in
    the cache folder while the installed metadata is unchanged: ``entry_points.py``)."""
    from anychip.core.plugin.entry_points import entry_points

    return entry_points(GROUP)


def discover(extra: Iterable[tuple[str, Any]] = ()) -> list[Candidate]:
    """Every plugin, nothing imported: the built-ins, the entry points (a name taken already
    is skipped, and so is a module found already under another name: a built-in's is that
    built-in), then
    ``extra`` (name, object) pairs added in-process."""
    found: dict[str, Candidate] = {}
    for name, module in BUILTIN.items():
        found[name] = Candidate(name, module, None, builtin=True)
    seen = set(BUILTIN.values())
    for ep in _installed():
        # one plugin module, one candidate: stale metadata (an old egg-info beside the
        # dist-info) may list the same module under an older name
        if ep.value in seen or ep.name in found:
            continue
        seen.add(ep.value)
        found[ep.name] = Candidate(ep.name, ep.value, ep)
    out = list(found.values())
    for name, obj in extra:
        module = getattr(obj, "__name__", repr(obj))
        out.append(Candidate(name, module, obj, in_process=True))
    return out


def disabled() -> tuple[set[str], bool]:
    """``ANYCHIP_DISABLE_PLUGINS``: the names it lists (old names mapped to new ones) and
    whether it says ``*`` (every plugin but the built-ins)."""
    raw = os.environ.get("ANYCHIP_DISABLE_PLUGINS", "")
    names = {s.strip() for s in raw.split(",") if s.strip()}
    return {LEGACY_NAMES.get(n, n) for n in names}, "*" in names
