"""Finding OpenCL devices: pyopencl, an ICD loader with at least one platform, a device.

Every failure becomes a sentence for ``anychip devices`` (no pyopencl, no platform/ICD, no
device), never an exception that reaches the host. The on-disk binary caches are pointed under
anychip's cache folder *before* the first platform query, because PoCL reads ``POCL_CACHE_DIR``
when its platform starts.

Invariants:
    * ``find_devices()`` is computed once per process (thread-safe) and lists devices in the
      ICD's platform order, then each platform's device order: ``opencl:<i>`` is entry ``i``.
    * The default device (``opencl``) is the first GPU or accelerator, else entry 0.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["DeviceInfo", "find_devices", "kernel_cache_dir", "default_index"]

_LOCK = threading.Lock()
_FOUND: tuple[list[DeviceInfo], str] | None = None


class DeviceInfo:
    """What anychip reads about one OpenCL device (the pyopencl objects stay inside)."""

    __slots__ = (
        "index",
        "platform",
        "device",
        "name",
        "vendor",
        "type",
        "driver",
        "fp64",
        "fp16",
        "global_mem",
        "max_alloc",
        "max_work_group",
        "local_mem",
        "compute_units",
        "clock_mhz",
    )

    def __init__(self, index: int, platform: Any, device: Any) -> None:
        import pyopencl as cl

        self.index = index
        self.platform = platform
        self.device = device
        self.name = device.name.strip()
        self.vendor = platform.name.strip()
        kinds = device.type
        if kinds & cl.device_type.GPU:
            self.type = "gpu"
        elif kinds & cl.device_type.ACCELERATOR:
            self.type = "accelerator"
        else:
            self.type = "cpu"
        self.driver = device.driver_version.strip()
        ext = device.extensions.split()
        self.fp64 = "cl_khr_fp64" in ext or device.double_fp_config != 0
        self.fp16 = "cl_khr_fp16" in ext
        self.global_mem = int(device.global_mem_size)
        self.max_alloc = int(device.max_mem_alloc_size)
        self.max_work_group = int(device.max_work_group_size)
        self.local_mem = int(device.local_mem_size)
        self.compute_units = int(device.max_compute_units)
        self.clock_mhz = int(device.max_clock_frequency or 1000)

    @property
    def key(self) -> str:
        """Names the compiled-binary cache: device, platform and driver version."""
        raw = f"{self.vendor}-{self.name}-{self.driver}"
        return "".join(c if c.isalnum() or c in "._-" else "_" for c in raw)[:120]

    def __repr__(self) -> str:
        return f"<opencl:{self.index} {self.type} {self.name!r} on {self.vendor!r}>"


def kernel_cache_dir() -> Path:
    """``<anychip cache>/opencl``: PoCL's and pyopencl's binary caches live under it."""
    from anychip.paths import cache_root

    return cache_root() / "opencl"


def _point_caches() -> None:
    """Point PoCL's kernel cache under anychip's cache folder, unless the user chose one.

    PoCL keys its cache entries by device and build options itself and writes each entry to a
    temporary file renamed into place, so processes (pytest-xdist workers) may share it.
    """
    if "POCL_CACHE_DIR" in os.environ:
        return
    folder = kernel_cache_dir() / "pocl"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # PoCL then uses its default (~/.cache/pocl), or none
    os.environ["POCL_CACHE_DIR"] = str(folder)


def _scan() -> tuple[list[DeviceInfo], str]:
    try:
        import pyopencl as cl
    except ImportError as e:
        return [], (
            f"pyopencl is not installed ({e}); `pip install 'anychip[opencl]'` installs it "
            "with PoCL, a CPU OpenCL driver"
        )
    try:
        platforms = cl.get_platforms()
    except Exception as e:
        return [], (
            f"no OpenCL platform: the ICD loader found none ({' '.join(str(e).split())}); "
            "install a vendor driver or `pip install 'pyopencl[pocl]'`"
        )
    found: list[DeviceInfo] = []
    problems = []
    for p in platforms:
        try:
            devices = p.get_devices()
        except Exception as e:
            problems.append(f"{p.name.strip()}: {' '.join(str(e).split())}")
            continue
        for d in devices:
            found.append(DeviceInfo(len(found), p, d))
    if not found:
        names = "; ".join(problems) or f"{len(platforms)} platform(s), none with a device"
        return [], f"no OpenCL device ({names})"
    return found, ""


def find_devices() -> tuple[list[DeviceInfo], str]:
    """``(devices, why)``: the OpenCL devices here, or none and the reason."""
    global _FOUND
    with _LOCK:
        if _FOUND is None:
            _point_caches()
            _FOUND = _scan()
        return _FOUND


def default_index(devices: list[DeviceInfo]) -> int:
    """The device ``opencl`` names: the first GPU or accelerator, else the first device."""
    for d in devices:
        if d.type != "cpu":
            return d.index
    return 0
