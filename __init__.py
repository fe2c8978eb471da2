"""anychip: run one model unchanged on any chip.

import anychip
sess = anychip.load("model.onnx", devices=["npu", "cpu"])
y, = sess.run(None, {"x": x})
print(sess.placement())

Importing anychip is cheap (errors and the version): ``load``, ``Session``, ``SessionOptions``,
``IOInfo``, ``hookimpl`` and the subpackages (``anychip.ir``, ``anychip.core``...) are imported
on first use through a module ``__getattr__`` (PEP 562), so onnx, ml_dtypes and pluggy load when
a model is loaded or built, and each backend when a session first needs its device
(``core/plugin/host.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from anychip.core.report.render import set_provider as _set_views_provider
from anychip.errors import (
    AnychipError,
    BringUpError,
    CompileTimeout,
    DeviceError,
    GraphError,
    InputError,
    KernelError,
    ModelError,
    OutOfMemoryError,
    PassLoopError,
    PlacementError,
    PluginError,
    RunTerminatedError,
    UnsupportedDTypeError,
    UnsupportedOpError,
)
from anychip.version import __version__

if TYPE_CHECKING:
    from anychip.core.api.device_values import DeviceValue
    from anychip.core.api.export import load_compiled
    from anychip.core.api.session import IOInfo, Session, SessionOptions, load
    from anychip.core.api.throughput import InferQueue
    from anychip.core.plugin.hookspecs import hookimpl

#: Public names imported on first access: name -> the module that defines it.
_LAZY = {
    "load": "anychip.core.api.session",
    "load_compiled": "anychip.core.api.export",
    "InferQueue": "anychip.core.api.throughput",
    "DeviceValue": "anychip.core.api.device_values",
    "Session": "anychip.core.api.session",
    "SessionOptions": "anychip.core.api.options",
    "IOInfo": "anychip.core.api.feeds",
    "hookimpl": "anychip.core.plugin.hookspecs",
}
#: Subpackages reachable as attributes (``anychip.ir.GraphBuilder``) as when they were imported
#: eagerly. ``core`` brings the session module with it, so that the attribute paths it made
#: (``anychip.core.plugin.host.get_registry``) keep working.
_SUBMODULES = {
    "core": "anychip.core.api.session",
    "ir": "anychip.ir",
    "opsets": "anychip.opsets",
    "paths": "anychip.paths",
}


def __getattr__(name: str) -> Any:
    """Import a public name or subpackage on first access (PEP 562); cached in the module."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        importlib.import_module(_SUBMODULES[name])
        value = importlib.import_module(f"anychip.{name}")
    else:
        raise AttributeError(f"module 'anychip' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


def _log_from_environment() -> None:
    """``ANYCHIP_LOG_LEVEL`` set: the ``anychip`` logger at that level (``core/logsetup.py``)."""
    import os
    import warnings

    if os.environ.get("ANYCHIP_LOG_LEVEL"):
        from anychip.core.logsetup import configure_logging

        try:
            configure_logging()
        except AnychipError as e:
            warnings.warn(str(e), stacklevel=3)


_log_from_environment()


def _viz_views() -> None:
    """Import ``anychip.viz``, whose modules register the reports' HTML, rich and timeline views
    (``core/report/render.py``): core may not import viz, the package root may."""
    import anychip.viz  # noqa: F401


_set_views_provider(_viz_views)

__all__ = [
    "load",
    "load_compiled",
    "InferQueue",
    "SessionOptions",
    "devices",
    "Session",
    "IOInfo",
    "DeviceValue",
    "DeviceInfo",
    "hookimpl",
    "AnychipError",
    "BringUpError",
    "DeviceError",
    "CompileTimeout",
    "GraphError",
    "InputError",
    "KernelError",
    "ModelError",
    "OutOfMemoryError",
    "PassLoopError",
    "PlacementError",
    "PluginError",
    "RunTerminatedError",
    "UnsupportedDTypeError",
    "UnsupportedOpError",
    "__version__",
]


class DeviceInfo:
    """One backend as ``anychip.devices()`` lists it."""

    __slots__ = (
        "name",
        "kind",
        "available",
        "reason",
        "priority",
        "plugin",
        "kernels",
        "graph_mode",
        "about",
        "simulated",
        "auto_select",
    )

    def __init__(
        self,
        name: str,
        kind: str,
        available: bool,
        reason: str,
        priority: int,
        plugin: str,
        kernels: int,
        graph_mode: bool = False,
        about: str = "",
        simulated: bool = False,
        auto_select: bool = True,
    ) -> None:
        self.name = name
        self.kind = kind
        self.available = available
        self.reason = reason
        self.priority = priority
        self.plugin = plugin
        self.kernels = kernels
        #: True for whole-graph compilers (NPU style), which have no per-op kernel table.
        self.graph_mode = graph_mode
        #: What stands behind the device, with versions (``Backend.about``; may be empty).
        self.about = about
        #: True for a device simulated on the host (``npu``, ``xpu``): no chip behind it.
        self.simulated = simulated
        #: False for a device that joins a session only when named (``Backend.auto_select``:
        #: the vendor runtimes, a CPU's OpenCL, IREE's devices).
        self.auto_select = auto_select

    def __repr__(self) -> str:
        state = "available" if self.available else f"unavailable: {self.reason}"
        return f"DeviceInfo({self.name!r}, {state})"


def _about(backend: Any) -> str:
    """``backend.about``, or why it could not say (a backend's description never fails the
    listing)."""
    try:
        return str(backend.about or "")
    except Exception as e:
        return f"(about raised {type(e).__name__}: {e})"


def devices(include_failed_plugins: bool = False) -> list[Any]:
    """Every registered backend with its availability and, when unavailable, why.

    With ``include_failed_plugins=True`` the plugins that failed to load are appended as
    ``DeviceInfo`` rows with ``available=False`` and the error as reason.
    """
    from anychip.core.plugin.host import get_registry

    registry = get_registry()
    out: list[Any] = []
    # by name among equal priorities: the order plugins happened to be imported in is no order
    for b in sorted(
        registry.backends.values(), key=lambda b: (b.name == "cpu", -b.priority, b.name)
    ):
        ok, why = b.available()
        out.append(
            DeviceInfo(
                b.name,
                b.kind or b.name,
                ok,
                why,
                b.priority,
                b.origin,
                len(registry.kernels.get(b.name, ())),
                b.graph_mode,
                _about(b),
                bool(getattr(b, "simulated", False)),
                bool(getattr(b, "auto_select", True)),
            )
        )
    if include_failed_plugins:
        for rec in registry.plugins:
            if not rec.ok:
                out.append(DeviceInfo(rec.name, "plugin", False, rec.error, 0, rec.name, 0))
    return out
