"""OpenVINO itself: the one ``ov.Core`` of the process, its devices and what each can compute.

Everything here imports ``openvino`` lazily (``import anychip`` and the plugin's hooks do not
pay its 0.3 s until a device is enumerated). ``core()`` is made once under a lock, whatever the
threads; OpenVINO's ``Core`` is safe to share between threads.

Device names: OpenVINO lists ``CPU``, ``GPU`` (or ``GPU.0``, ``GPU.1``... with several GPUs),
``NPU``; anychip's device is ``openvino:`` plus the name in lower case (anychip's device names
are case-insensitive: ``openvino:CPU`` and ``openvino:cpu`` are one device).

Precisions: anychip's names ``f32``, ``bf16``, ``f16`` (``fp32``, ``fp16`` accepted) map to
OpenVINO's ``INFERENCE_PRECISION_HINT`` values; a device computes a precision when its
``OPTIMIZATION_CAPABILITIES`` list it (``FP32``, ``BF16``, ``FP16``).
"""

from __future__ import annotations

import threading
from typing import Any

from anychip.errors import DeviceError

__all__ = [
    "FIXED",
    "PRECISIONS",
    "core",
    "device_ids",
    "import_error",
    "ov_version",
    "parse_precision",
    "properties",
    "short_error",
    "supports_precision",
]

#: The devices always listed (unavailable where OpenVINO does not find them).
FIXED = ("CPU", "GPU", "NPU")
#: anychip's precision names -> (OpenVINO's hint value, the capability a device lists).
PRECISIONS = {"f32": ("f32", "FP32"), "bf16": ("bf16", "BF16"), "f16": ("f16", "FP16")}
_ALIASES = {"fp32": "f32", "float32": "f32", "fp16": "f16", "float16": "f16", "bfloat16": "bf16"}

_lock = threading.Lock()
_core: Any = None
_devices: list[str] | None = None
_properties: dict[str, dict[str, Any]] = {}


def import_error() -> str | None:
    """None when ``openvino`` imports, else why not and what to do."""
    try:
        import openvino  # noqa: F401
    except Exception as e:  # an ImportError, or a broken wheel's OSError
        return (
            f"OpenVINO is not installed or does not import ({type(e).__name__}: {e}); "
            "pip install 'anychip[openvino]'"
        )
    return None


def core() -> Any:
    """The process's ``openvino.Core`` (made on first use, once)."""
    global _core
    if _core is None:
        with _lock:
            if _core is None:
                import openvino as ov

                _core = ov.Core()
    return _core


def ov_version() -> str:
    """OpenVINO's version, e.g. ``2026.4.1-22982-e213a147257-releases/2026/4``."""
    import openvino as ov

    return str(ov.get_version())


def device_ids() -> list[str]:
    """``Core.available_devices`` (read once): ``['CPU']``, ``['CPU', 'GPU.0', 'GPU.1']``..."""
    global _devices
    if _devices is None:
        found = list(core().available_devices)
        with _lock:
            _devices = found
    return list(_devices)


def properties(device: str) -> dict[str, Any]:
    """The device's name, capabilities and supported properties, read once (None where the
    device's plugin cannot answer)."""
    known = _properties.get(device)
    if known is not None:
        return known
    c = core()
    out: dict[str, Any] = {}
    for key in ("FULL_DEVICE_NAME", "OPTIMIZATION_CAPABILITIES", "SUPPORTED_PROPERTIES"):
        try:
            out[key] = c.get_property(device, key)
        except Exception:  # a device whose plugin cannot answer: nothing known
            out[key] = None
    with _lock:
        return _properties.setdefault(device, out)


def parse_precision(value: Any, device: str) -> str:
    """anychip's precision name for ``value`` (``"f32"``, ``"bf16"``, ``"f16"``).

    Raises:
        DeviceError: ``value`` is none of them (the message lists them).
    """
    name = str(value).strip().lower()
    name = _ALIASES.get(name, name)
    if name not in PRECISIONS:
        raise DeviceError(
            f"{device}: precision must be one of {list(PRECISIONS)} (f32 is the default and "
            f"never changes results; bf16 and f16 are opt-in), got {value!r}"
        )
    return name


def supports_precision(capabilities: Any, precision: str) -> bool:
    """Whether a device whose ``OPTIMIZATION_CAPABILITIES`` are ``capabilities`` computes
    ``precision`` (unknown capabilities: assumed yes, OpenVINO then decides)."""
    if not capabilities:
        return True
    return PRECISIONS[precision][1] in {str(c).upper() for c in capabilities}


def short_error(e: BaseException) -> str:
    """OpenVINO's multi-line message on one line, without its source locations."""
    lines = [
        ln.strip()
        for ln in str(e).splitlines()
        if ln.strip() and not ln.strip().startswith(("Exception from src", "Check '"))
    ]
    return f"{type(e).__name__}: {' '.join(lines) or e}"[:500]
