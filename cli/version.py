"""``anychip --version``: anychip's version, the libraries it stands on, and each plugin's.

A built-in plugin has anychip's version; a third-party one its distribution's (from the entry
point's metadata). Each backend adds its ``version`` (the revision its caches are keyed on) and
``about`` (the runtime or driver behind it), so a bug report says what ran.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

__all__ = ["version_lines"]


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _plugin_version(candidate: Any, anychip_version: str) -> str:
    dist = getattr(candidate.loader, "dist", None)
    # anychip's own entry points (an installed copy's metadata) are built-ins too
    if candidate.builtin or (dist is not None and dist.metadata["Name"] == "anychip"):
        return f"{anychip_version} (built in)"
    if dist is not None:
        return f"{dist.metadata['Name']} {dist.version}"
    return "in-process" if candidate.in_process else "?"


def version_lines() -> list[str]:
    """The lines ``anychip --version`` prints (imports every plugin, as ``anychip devices``)."""
    from anychip.core.plugin.discovery import discover
    from anychip.core.plugin.host import get_registry
    from anychip.version import __version__

    lines = [
        f"anychip {__version__}",
        f"python {platform.python_version()}, "
        + ", ".join(f"{d} {_dist_version(d)}" for d in ("numpy", "onnx", "pluggy")),
    ]
    registry = get_registry()
    records = {r.name: r for r in registry.plugins}
    lines.append("plugins:")
    for c in sorted(discover(), key=lambda c: c.name):
        rec = records.get(c.name)
        state = "" if rec is None or rec.ok else f"; left out: {rec.error}"
        lines.append(f"  {c.name:<10} {_plugin_version(c, __version__)}{state}")
        mine = sorted((b for b in registry.backends.values() if b.origin == c.name), key=_name)
        missing = [b.name for b in mine if not b.available()[0]]
        for b in mine:
            if b.name not in missing:
                about = _about(b)
                rev = f" (revision {b.version})" if b.version else ""
                lines.append(f"    {b.name}{rev}{f': {about}' if about else ''}")
        if missing:
            lines.append(f"    not available here: {', '.join(missing)} (`anychip devices`: why)")
    return lines


def _name(backend: Any) -> str:
    return str(backend.name)


def _about(backend: Any) -> str:
    try:
        return str(backend.about or "")
    except Exception as e:  # a description never fails the listing
        return f"(about raised {type(e).__name__}: {e})"
