"""anychip: run one model unchanged on any chip.

import anychip
sess = anychip.load("model.onnx", devices=["npu", "cpu"])
y, = sess.run(None, {"x": x})
print(sess.placement())
"""

from __future__ import annotations

from typing import Any

from anychip.core.api.session import IOInfo, Session, SessionOptions, load
from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.report.render import set_provider as _set_views_provider
from anychip.errors import (
    AnychipError,
    DeviceError,
    GraphError,
    InputError,
    KernelError,
    ModelError,
    OutOfMemoryError,
    PlacementError,
    PluginError,
    UnsupportedDTypeError,
    UnsupportedOpError,
)
from anychip.version import __version__


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
    "SessionOptions",
    "devices",
    "Session",
    "IOInfo",
    "DeviceInfo",
    "hookimpl",
    "AnychipError",
    "DeviceError",
    "GraphError",
    "InputError",
    "KernelError",
    "ModelError",
    "OutOfMemoryError",
    "PlacementError",
    "PluginError",
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

    def __repr__(self) -> str:
        state = "available" if self.available else f"unavailable: {self.reason}"
        return f"DeviceInfo({self.name!r}, {state})"


def devices(include_failed_plugins: bool = False) -> list[Any]:
    """Every registered backend with its availability and, when unavailable, why.

    With ``include_failed_plugins=True`` the plugins that failed to load are appended as
    ``DeviceInfo`` rows with ``available=False`` and the error as reason.
    """
    from anychip.core.plugin.host import get_registry

    registry = get_registry()
    out: list[Any] = []
    for b in sorted(registry.backends.values(), key=lambda b: (b.name == "cpu", -b.priority)):
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
            )
        )
    if include_failed_plugins:
        for rec in registry.plugins:
            if not rec.ok:
                out.append(DeviceInfo(rec.name, "plugin", False, rec.error, 0, rec.name, 0))
    return out
