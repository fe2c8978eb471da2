"""IREE's runtime: one VM instance and one HAL device per driver and device per process.

Everything imports ``iree.runtime`` lazily (``import anychip`` and the plugin's hooks pay
nothing until a device is enumerated). Devices are made once under a lock and live until the
process ends; ``_teardown`` (``atexit``) closes every live executable before the devices and
the instance, in that order: left to the garbage collector, IREE's objects are freed in any
order and a Vulkan device freed before its modules crashes the interpreter at exit; then
IREE's leak report is turned off (what is left is freed with the process).

Host buffers: Vulkan imports host memory only at its ``minImportedHostPointerAlignment``
(4096 bytes on lavapipe), pointer and size alike, so ``to_host`` copies into a 4096-aligned
numpy buffer rounded up to whole pages and returns the view of its first bytes.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any

import numpy as np

__all__ = [
    "ALIGN",
    "compiler_version",
    "device",
    "import_error",
    "instance",
    "runtime_version",
    "to_device",
    "to_host",
    "vulkan_devices",
]

#: Host buffers handed to IREE are aligned to this (Vulkan's import alignment on lavapipe).
ALIGN = 4096
_lock = threading.RLock()
_instance: Any = None
_devices: dict[tuple[str, int | None], Any] = {}
_listed: dict[str, list[dict[str, Any]]] = {}
_live: weakref.WeakSet[Any] = weakref.WeakSet()
#: (driver, index) -> [bytes of live device arrays anychip holds, their peak]. IREE's own
#: allocator statistics do not count frees on Vulkan (lavapipe), so anychip counts its arrays.
_held: dict[tuple[str, int | None], list[int]] = {}


def import_error() -> str | None:
    """None when IREE's compiler and runtime import, else why not and what to do."""
    try:
        import iree.compiler
        import iree.runtime  # noqa: F401
    except Exception as e:  # an ImportError, or a wheel for another platform
        return (
            f"IREE is not installed or does not import ({type(e).__name__}: {e}); "
            "pip install 'anychip[iree]'"
        )
    return None


def compiler_version() -> str:
    """``iree-base-compiler``'s version (``3.13.0rc20261016``)."""
    import iree.compiler.version as v

    return str(v.VERSION)


def runtime_version() -> str:
    import iree.runtime.version as v

    return str(v.VERSION)


def instance() -> Any:
    """The process's ``VmInstance`` (made once)."""
    global _instance
    with _lock:
        if _instance is None:
            import iree.runtime as rt

            _instance = rt.VmInstance()
            atexit.register(_teardown)
        return _instance


def drivers() -> list[str]:
    """The HAL drivers this IREE runtime was built with (``vulkan``, ``local-task``...)."""
    import iree.runtime as rt

    return list(rt.query_available_drivers())


def listed(driver: str) -> list[dict[str, Any]]:
    """The devices ``driver`` enumerates here (read once; empty where it cannot start)."""
    with _lock:
        if driver not in _listed:
            try:
                import iree.runtime as rt

                instance()  # registers the teardown before any driver object exists
                found = list(rt.get_driver(driver).query_available_devices())
            except Exception:  # no loader, no ICD, no GPU: nothing listed, the backend says why
                found = []
            _listed[driver] = found
        return list(_listed[driver])


def vulkan_devices() -> list[dict[str, Any]]:
    """Vulkan's physical devices as IREE enumerates them (``name``, ``device_id``...)."""
    return listed("vulkan")


def device(driver: str, index: int | None = None) -> Any:
    """The ``HalDevice`` of ``driver`` (its ``index``-th enumerated device), made once."""
    key = (driver, index)
    with _lock:
        dev = _devices.get(key)
        if dev is None:
            import iree.runtime as rt

            instance()  # the teardown is registered before any device exists
            drv = rt.get_driver(driver)
            if index is None:
                dev = drv.create_default_device()
            else:
                dev = drv.create_device(listed(driver)[index])
            _devices[key] = dev
        return dev


def track(executable: Any) -> None:
    """Have ``executable.close()`` called at exit, before the devices go."""
    _live.add(executable)


def aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 buffer of ``nbytes`` rounded up to ``ALIGN``, starting on an ``ALIGN`` boundary."""
    size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
    raw = np.empty(size + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start : start + size]


def to_device(dev: Any, array: np.ndarray, key: tuple[str, int | None]) -> Any:
    """``array`` as an IREE ``DeviceArray`` on ``dev`` (a copy into device memory), counted."""
    import iree.runtime as rt

    a = np.ascontiguousarray(array) if array.ndim else np.asarray(array)
    return hold(rt.asdevicearray(dev, a), key)


def hold(tensor: Any, key: tuple[str, int | None]) -> Any:
    """Count ``tensor``'s bytes as held on device ``key`` until ``drop`` or its collection."""
    if getattr(tensor, "_anychip_held", None) is not None:
        return tensor
    nbytes = int(tensor._buffer_view.byte_length)
    with _lock:
        held = _held.setdefault(key, [0, 0])
        held[0] += nbytes
        held[1] = max(held[1], held[0])
    tensor._anychip_held = weakref.finalize(tensor, _unhold, key, nbytes)
    return tensor


def _unhold(key: tuple[str, int | None], nbytes: int) -> None:
    with _lock:
        _held[key][0] -= nbytes


def drop(tensor: Any) -> None:
    """Give ``tensor``'s buffer back now (its count with it)."""
    fin = getattr(tensor, "_anychip_held", None)
    if fin is not None:
        fin()
    for attr in ("_host_array", "_mapped_memory", "_buffer_view"):
        if hasattr(tensor, attr):
            setattr(tensor, attr, None)


def held(key: tuple[str, int | None]) -> tuple[int, int]:
    """Bytes of the device arrays anychip holds on device ``key``, and their peak."""
    with _lock:
        in_use, peak = _held.get(key, (0, 0))
        return in_use, peak


def to_host(dev: Any, tensor: Any) -> np.ndarray:
    """A fresh host array with the contents of the ``DeviceArray`` ``tensor``."""
    import iree.runtime as rt

    view = tensor._buffer_view
    shape = tuple(int(d) for d in view.shape)
    dtype = np.dtype(tensor.dtype)
    raw_dtype = rt.HalElementType.map_to_dtype(view.element_type)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(raw_dtype).itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    if tensor._is_mappable():
        out = np.array(tensor.to_host(), dtype=dtype, copy=True)
        return out.reshape(shape)
    staging = aligned_empty(nbytes)
    usage = int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_PERSISTENT)
    memory = int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE)
    target = dev.allocator.import_host_allocation(staging, memory_type=memory, allowed_usage=usage)
    sem = dev.create_semaphore(0)
    dev.queue_copy(
        view.get_buffer(),
        target,
        wait_semaphores=rt.HalFence.create_at(sem, 0),
        signal_semaphores=rt.HalFence.create_at(sem, 1),
    )
    rt.HalFence.create_at(sem, 1).wait()
    del target
    out = staging[:nbytes].view(raw_dtype).reshape(shape)
    return out if raw_dtype == dtype else out.astype(dtype)


def _teardown() -> None:
    """Close every live executable, then drop the devices and the instance (at exit)."""
    global _instance
    import gc

    for exe in list(_live):
        try:
            exe.close()
        except Exception:  # at exit: nothing left to tell
            pass
    gc.collect()
    with _lock:
        _devices.clear()
        gc.collect()
        _instance = None
    try:
        # objects the caller still holds at exit (a session never closed, IREE's own driver
        # cache) would each print a nanobind "leaked instance" line: the process is ending
        from iree._runtime_libs._runtime import disable_leak_checker

        disable_leak_checker()
    except Exception:  # another IREE build without it: the lines are harmless
        pass
