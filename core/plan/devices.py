"""Which devices a session uses: the argument, ``ANYCHIP_DEVICES``, or every available one."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from anychip.core.plugin.discovery import device_kind, plugin_kinds
from anychip.core.plugin.host import get_registry
from anychip.errors import DeviceError

__all__ = ["resolve_devices"]


def resolve_devices(devices: Sequence[str] | str | None, strict: bool = False) -> list[str]:
    """The device names a session uses, from the argument, ``ANYCHIP_DEVICES``, or all.

    Without an explicit list, every available backend is used, highest priority first, cpu
    last, except a backend whose ``auto_select`` is False (one that must be named: an alias of
    another device, or an OpenCL CPU device sharing the host's cores). ``cpu`` is appended as
    the fallback unless ``strict`` or already listed. Only the plugins of the listed devices
    (and the cpu's) are imported; without a list, every plugin (``core/plugin/host.py``).
    """
    if devices is None:
        devices = os.environ.get("ANYCHIP_DEVICES") or None
    if isinstance(devices, str):
        devices = [d.strip() for d in devices.split(",") if d.strip()]
    registry = get_registry(None if devices is None else list(devices))
    if devices is None:
        # auto_select first: a device that must be named is not probed (onnxruntime's CUDA
        # and TensorRT providers load a model to answer)
        avail = [b for b in registry.backends.values() if b.auto_select and b.available()[0]]
        avail.sort(key=lambda b: (b.name == "cpu", -b.priority, b.name))
        names = [b.name for b in avail]
    else:
        names = []
        for d in devices:
            name = d.lower()
            b = registry.backends.get(name)
            if b is None:
                known = ", ".join(sorted(registry.backends)) or "none"
                raise DeviceError(
                    f"unknown device {d!r}; known devices: {known}. "
                    f"{_failed_plugins(registry, name)}See `anychip devices` for what is "
                    "installed and why a device may be missing."
                )
            ok, why = b.available()
            if not ok and not b.kept_when_unavailable:
                raise DeviceError(f"device {name!r} is not available here: {why}")
            if name not in names:
                names.append(name)
    if not names:
        raise DeviceError("no device is available; `anychip devices` shows why")
    if "cpu" not in names and not strict:
        names.append("cpu")
        # said, not hidden: devices=["npu"] is a session on npu and cpu (strict=True: npu alone)
        logging.getLogger("anychip").info(
            "anychip: devices %s: the cpu added as the fallback (strict=True runs on %s alone)",
            names[:-1], ", ".join(names[:-1]),
        )  # fmt: skip
    return names


def _failed_plugins(registry: Any, device: str) -> str:
    """A sentence naming the plugins of ``device``'s kind that failed or were disabled."""
    kind = device_kind(device)
    bad = [r for r in registry.plugins if not r.ok and kind in plugin_kinds(r.name)]
    if not bad:
        return ""
    return (
        " ".join(f"Plugin {r.name!r} provides it but was left out: {r.error}." for r in bad) + " "
    )
