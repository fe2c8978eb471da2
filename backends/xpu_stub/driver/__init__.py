"""The XPU stub's driver: a C library built on first use and bound with cffi in ABI mode.

The simulated XPU is a kernel-launch accelerator whose "driver" is the C code in ``driver/``
(``xpu.h`` is its ABI). Each :class:`XpuDriver` owns one device: one heap malloc'd by the C
side, named by opaque 64-bit handles (never host pointers), a first-fit allocator with
coalescing, memory copies, and an in-order launch queue that runs at :meth:`synchronize` and
before every memory call. A launch is validated when it is enqueued, so a bad handle or an
out-of-bounds access is an error status, never a crash.

Why cffi ABI mode (``ffi.cdef`` + ``ffi.dlopen``) rather than API mode (``ffi.set_source`` +
``ffi.compile``): API mode builds a CPython extension through setuptools, which needs the
Python headers, picks its compiler and flags from sysconfig, and hides the compiler's stderr
behind a setuptools exception. ABI mode lets this module run the compiler itself (``$CC`` or
``cc``/``gcc``/``clang``, flags ``-O2 -fPIC``, never ``-march=native``, so the cached library
is portable), report exactly which command failed and why, and build a plain shared library
that needs nothing from Python. The price is that cffi cannot check the declarations against
the header; the cdef is therefore read verbatim from ``xpu.h``, so there is one source.

Build cache: ``$ANYCHIP_CACHE_DIR/xpu/<hash>/libxpu.so`` (default cache root
``$XDG_CACHE_HOME/anychip`` or ``~/.cache/anychip``), where the hash covers the sources, the
compiler command and the compiler binary's identity. The library is compiled to a temporary
name in that folder and renamed into place, so concurrent processes never load a half-written
file. No compiler, or a compile error, raises :class:`~anychip.errors.DeviceError` saying
which compiler was tried, the tail of its stderr, and how to fix it.

Example:
    >>> import numpy as np
    >>> drv = get_driver()
    >>> t = drv.upload(np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> t.numpy().sum()
    np.float32(15.0)
    >>> t.free()
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from anychip.backends.xpu_stub.driver.build import DEFAULT_HEAP_BYTES, build_library, load_library
from anychip.errors import DeviceError, OutOfMemoryError

__all__ = [
    "DEFAULT_HEAP_BYTES",
    "XpuDriver",
    "XpuHeapStats",
    "XpuMemInfo",
    "XpuTensor",
    "build_library",
    "get_driver",
    "num_threads",
    "set_num_threads",
]

# Status codes of xpu.h, for errors that need special handling.
_ERR_OUT_OF_MEMORY = 4


# ---- device tensors --------------------------------------------------------------------------


class XpuMemInfo(NamedTuple):
    """Device heap accounting in bytes; ``used`` counts reserved (64-byte aligned) blocks."""

    used: int
    capacity: int
    peak: int


class XpuHeapStats(NamedTuple):
    """The allocator's block list: how many blocks, how many free, the largest free one."""

    blocks: int
    free_blocks: int
    largest_free: int


class XpuTensor:
    """A dense, row-major tensor in XPU memory: a driver handle plus shape and dtype.

    The tensor does not free itself: whoever allocated it calls :meth:`free` (the backend's
    memory pool decides lifetimes). A view made by ``xpu_reshape(..., copy=False)`` shares its
    base's handle and must not be freed separately; ``is_view`` says which.
    """

    __slots__ = ("handle", "shape", "dtype", "nbytes", "driver", "is_view")

    def __init__(
        self,
        handle: int,
        shape: Sequence[int],
        dtype: Any,
        nbytes: int | None = None,
        driver: XpuDriver | None = None,
        *,
        is_view: bool = False,
    ) -> None:
        self.handle = int(handle)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = size * self.dtype.itemsize if nbytes is None else int(nbytes)
        self.driver = driver if driver is not None else get_driver()
        self.is_view = is_view

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numpy(self) -> np.ndarray:
        """A fresh host copy of the tensor."""
        return self.driver.copy_out(self.handle, self.shape, self.dtype)

    def free(self) -> None:
        """Returns the buffer to the device heap (a view frees nothing)."""
        if not self.is_view:
            self.driver.free(self.handle)

    def __repr__(self) -> str:
        view = ", view" if self.is_view else ""
        return f"XpuTensor(0x{self.handle:x}, shape={self.shape}, dtype={self.dtype}{view})"


# ---- the driver ------------------------------------------------------------------------------


def _shutdown(lib: Any, dev: Any) -> None:
    lib.xpu_shutdown(dev)


class XpuDriver:
    """One simulated XPU device: its heap, copies and kernel launches.

    All calls hold one lock (the C side keeps no locks of its own); cffi releases the GIL
    while C runs, so two drivers compute in parallel. Use :func:`get_driver` for the
    process-wide device; tests create extra drivers with small heaps, each fully independent.

    Args:
        heap_bytes: heap size; default ``$ANYCHIP_XPU_HEAP_BYTES`` or 1 GiB.
        name: the device name used in error messages.

    Raises:
        DeviceError: the driver cannot be built or loaded, or the heap cannot be reserved.
    """

    def __init__(self, heap_bytes: int | None = None, *, name: str = "xpu") -> None:
        self._ffi, self._lib, self._kernel_ids = load_library()
        self.name = name
        self._lock = threading.RLock()
        if heap_bytes is None:
            heap_bytes = _heap_bytes_from_env()
        if heap_bytes <= 0:
            raise DeviceError(f"{name}: heap size must be positive, got {heap_bytes} bytes")
        out = self._ffi.new("xpu_device **")
        with self._lock:
            self._check(self._lib.xpu_init(heap_bytes, out), "reserving the device heap")
        self._dev = out[0]
        self._finalizer = weakref.finalize(self, _shutdown, self._lib, self._dev)

    # -- errors --

    def _check(self, status: int, what: str, need: int = 0) -> None:
        """Turns a failing status into an exception; call with the lock held."""
        if status == 0:
            return
        message = self._ffi.string(self._lib.xpu_last_error()).decode(errors="replace")
        if status == _ERR_OUT_OF_MEMORY:
            info = self._mem_info_locked()
            raise OutOfMemoryError(
                f"{self.name}: {message} while {what}; free device tensors, run fewer nodes "
                "on the XPU, or give it a larger heap (ANYCHIP_XPU_HEAP_BYTES)",
                device=self.name,
                need=need,
                capacity=info.capacity,
                in_use=info.used,
            )
        raise DeviceError(f"{self.name} driver error while {what}: {message}")

    def _device(self) -> Any:
        if not self._finalizer.alive:
            raise DeviceError(f"{self.name}: the device was closed; create a new XpuDriver")
        return self._dev

    # -- lifetime --

    def close(self) -> None:
        """Releases the heap; every handle becomes invalid. Safe to call twice."""
        with self._lock:
            self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    # -- memory --

    def malloc(self, nbytes: int) -> int:
        """Allocates ``nbytes`` of device memory and returns its handle.

        Raises:
            OutOfMemoryError: the heap has no free block that large (``need`` is nbytes).
        """
        if nbytes < 0:
            raise DeviceError(f"{self.name}: cannot allocate a negative size ({nbytes} bytes)")
        handle = self._ffi.new("uint64_t *")
        with self._lock:
            status = self._lib.xpu_malloc(self._device(), nbytes, handle)
            self._check(status, f"allocating {nbytes} bytes", need=nbytes)
        return int(handle[0])

    def free(self, handle: int) -> None:
        """Frees a buffer (after the queued launches that use it have run)."""
        with self._lock:
            self._check(self._lib.xpu_free(self._device(), handle), f"freeing 0x{handle:x}")

    def alias(self, base: int, offset: int, nbytes: int) -> int:
        """A handle naming ``nbytes`` at ``offset`` of buffer ``base`` (planned memory).

        Freeing it neither drains the queue nor returns memory; ``base`` cannot be freed while
        it has aliases (``DeviceError``).
        """
        handle = self._ffi.new("uint64_t *")
        with self._lock:
            status = self._lib.xpu_alias(self._device(), base, offset, nbytes, handle)
            self._check(status, f"aliasing {nbytes} bytes at {offset} of 0x{base:x}")
        return int(handle[0])

    def buffer_size(self, handle: int) -> int:
        """The size the buffer was allocated with, in bytes."""
        out = self._ffi.new("size_t *")
        with self._lock:
            status = self._lib.xpu_buffer_size(self._device(), handle, out)
            self._check(status, f"querying 0x{handle:x}")
        return int(out[0])

    def _mem_info_locked(self) -> XpuMemInfo:
        used, cap, peak = (self._ffi.new("size_t *") for _ in range(3))
        self._lib.xpu_mem_info(self._dev, used, cap, peak)
        return XpuMemInfo(int(used[0]), int(cap[0]), int(peak[0]))

    def mem_info(self) -> XpuMemInfo:
        """Bytes in use (reserved blocks), heap capacity, and the peak of ``used``."""
        with self._lock:
            self._device()
            return self._mem_info_locked()

    def heap_stats(self) -> XpuHeapStats:
        """The allocator's block counts: a fully coalesced empty heap has exactly one block."""
        blocks, free_blocks, largest = (self._ffi.new("size_t *") for _ in range(3))
        with self._lock:
            status = self._lib.xpu_heap_stats(self._device(), blocks, free_blocks, largest)
            self._check(status, "reading heap statistics")
        return XpuHeapStats(int(blocks[0]), int(free_blocks[0]), int(largest[0]))

    # -- copies --

    def copy_in(self, handle: int, array: np.ndarray, offset: int = 0) -> None:
        """Copies a host array's bytes (C order) into the buffer at ``offset`` bytes."""
        host = np.ascontiguousarray(array)
        if host.dtype.hasobject:
            raise DeviceError(f"{self.name}: cannot copy {host.dtype} (object) data to a device")
        src = self._ffi.from_buffer(host)
        with self._lock:
            status = self._lib.xpu_memcpy_htod(self._device(), handle, offset, src, host.nbytes)
            self._check(status, f"copying {host.nbytes} bytes to 0x{handle:x}")

    def copy_out(
        self, handle: int, shape: Sequence[int], dtype: Any, offset: int = 0
    ) -> np.ndarray:
        """Returns a fresh host array read from the buffer at ``offset`` bytes."""
        out = np.empty(tuple(shape), dtype=np.dtype(dtype))
        dst = self._ffi.from_buffer(out, require_writable=True)
        with self._lock:
            status = self._lib.xpu_memcpy_dtoh(self._device(), dst, handle, offset, out.nbytes)
            self._check(status, f"copying {out.nbytes} bytes from 0x{handle:x}")
        return out

    def copy_dtod(
        self, dst: int, src: int, nbytes: int, dst_offset: int = 0, src_offset: int = 0
    ) -> None:
        """Copies bytes between (or within) device buffers; overlapping ranges are fine."""
        with self._lock:
            status = self._lib.xpu_memcpy_dtod(
                self._device(), dst, dst_offset, src, src_offset, nbytes
            )
            self._check(status, f"copying {nbytes} bytes from 0x{src:x} to 0x{dst:x}")

    def poke(self, handle: int, offset: int, data: bytes) -> None:
        """Overwrites raw device bytes; tests use it to prove that copies are real."""
        with self._lock:
            src = self._ffi.from_buffer(bytes(data))
            status = self._lib.xpu_memcpy_htod(self._device(), handle, offset, src, len(data))
            self._check(status, f"writing {len(data)} bytes into 0x{handle:x}")

    # -- tensors --

    def empty(self, shape: Sequence[int], dtype: Any) -> XpuTensor:
        """Allocates an uninitialised device tensor."""
        shape = tuple(int(d) for d in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return XpuTensor(self.malloc(nbytes), shape, dtype, nbytes, self)

    def upload(self, array: np.ndarray) -> XpuTensor:
        """Allocates a device tensor holding a copy of ``array``."""
        host = np.asarray(array)
        tensor = self.empty(host.shape, host.dtype)
        try:
            self.copy_in(tensor.handle, host)
        except BaseException:
            self.free(tensor.handle)
            raise
        return tensor

    # -- kernels --

    def kernels(self) -> tuple[str, ...]:
        """Names of the kernels the C driver provides."""
        return tuple(self._kernel_ids)

    def launch(
        self,
        kernel: str,
        buffers: Sequence[int],
        iargs: Sequence[int] = (),
        fargs: Sequence[float] = (),
    ) -> None:
        """Validates and enqueues one kernel launch (argument layouts: see driver/*.c).

        Raises:
            DeviceError: unknown kernel, bad handle, wrong argument count, or an access that
                would fall outside a buffer; nothing is enqueued then.
        """
        kernel_id = self._kernel_ids.get(kernel)
        if kernel_id is None:
            raise DeviceError(
                f"{self.name}: the driver has no kernel {kernel!r}; it has "
                f"{', '.join(sorted(self._kernel_ids))}"
            )
        ffi = self._ffi
        bufs = ffi.new("uint64_t[]", [int(b) for b in buffers] or [0])
        ints = ffi.new("int64_t[]", [int(v) for v in iargs] or [0])
        floats = ffi.new("double[]", [float(v) for v in fargs] or [0.0])
        with self._lock:
            status = self._lib.xpu_launch(
                self._device(), kernel_id, bufs, len(buffers), ints, len(iargs), floats, len(fargs)
            )
            self._check(status, f"launching {kernel}")

    def synchronize(self) -> None:
        """Runs every queued launch; afterwards the queue is empty."""
        with self._lock:
            self._check(self._lib.xpu_synchronize(self._device()), "synchronizing")

    def queue_depth(self) -> int:
        """How many launches wait in the queue."""
        out = self._ffi.new("size_t *")
        with self._lock:
            self._check(self._lib.xpu_queue_depth(self._device(), out), "reading the queue")
        return int(out[0])

    def __repr__(self) -> str:
        if self.closed:
            return f"XpuDriver({self.name!r}, closed)"
        info = self.mem_info()
        return f"XpuDriver({self.name!r}, used={info.used}, capacity={info.capacity})"


def _heap_bytes_from_env() -> int:
    text = os.environ.get("ANYCHIP_XPU_HEAP_BYTES", "").strip()
    if not text:
        return DEFAULT_HEAP_BYTES
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    digits = text[:-1] if scale != 1 else text
    try:
        value = int(digits) * scale
    except ValueError:
        value = 0
    if value <= 0:
        raise DeviceError(
            f"ANYCHIP_XPU_HEAP_BYTES={text!r} is not a positive size; use bytes or a K/M/G "
            "suffix, e.g. 512M"
        )
    return value


_default: XpuDriver | None = None
_default_lock = threading.Lock()


def get_driver() -> XpuDriver:
    """The process-wide XPU device, built and initialised on first use.

    Raises:
        DeviceError: the driver cannot be built (no compiler) or loaded; the message says why.
    """
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = XpuDriver()
        return _default


# ---- host threads of the float32 MatMul / Gemm kernels -------------------------------------


def set_num_threads(n: int | None) -> None:
    """Sets how many host threads the float32 MatMul and Gemm kernels use, for the process;
    ``None`` (or 0) restores the default: ``$ANYCHIP_XPU_THREADS``, else min(2, cores).

    Raises:
        DeviceError: n is negative or above the driver's limit (64).
    """
    ffi, lib, _ = load_library()
    if lib.xpu_set_num_threads(int(n or 0)) != 0:
        raise DeviceError(ffi.string(lib.xpu_last_error()).decode())


def num_threads() -> int:
    """How many host threads the float32 MatMul and Gemm kernels use."""
    return int(load_library().lib.xpu_get_num_threads())
