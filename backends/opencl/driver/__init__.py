"""The OpenCL driver layer: one context and in-order queue per device, pooled buffers, tensors.

``ClDevice`` owns, per OpenCL device: a context, one in-order command queue (so a kernel always
sees the writes of every command enqueued before it, without explicit event waits), a
``CachingPool`` of ``cl.Buffer`` objects (anychip's size-class cache, the shape of PyTorch's and
tinygrad's allocators), the program cache (``programs.py``) and a cache of small argument
buffers (shapes and strides that kernels index with).

``ClTensor`` is a device tensor: shape, numpy dtype and a reference-counted storage. Reshape-like
kernels return a view sharing the storage; the buffer goes back to the pool when the last
tensor on it is released. A 0-sized tensor has no buffer.

Optionally (``use_copy_queue``, ``ANYCHIP_OPENCL_COPY_QUEUE=1``) host-to-device copies run on a
second in-order queue, ordered with the compute queue by events (see ``use_copy_queue``);
``overlap.copy_overlap`` measures whether the device runs the two at once. ``streams.ClStreams``
is the backend's stream/event contract on these two queues (copies both ways, ordered by events
the runtime records and waits on).

Invariants:
    * Host-to-device copies are enqueued without waiting (pyopencl keeps the host array alive
      until the copy is done); device-to-host copies wait, so the array returned is complete.
    * Kernels never write into an input: every kernel output is a fresh tensor.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from anychip.backends.opencl.driver.discovery import DeviceInfo, find_devices
from anychip.core.memory.caching import CachingPool
from anychip.core.memory.pool import Block
from anychip.errors import DeviceError

__all__ = ["ClDevice", "ClTensor", "get_device"]

_DEVICES: dict[int, ClDevice] = {}
_LOCK = threading.Lock()


class _Storage:
    """A pool block shared by a tensor and its views; freed when the last one is released."""

    __slots__ = ("block", "refs", "lock", "derived")

    def __init__(self, block: Block | None) -> None:
        self.block = block
        self.refs = 1
        self.lock = threading.Lock()
        #: tensors computed from this one and kept with it (packed GEMM panels of weights)
        self.derived: dict[Any, ClTensor] | None = None


class ClTensor:
    """A tensor in an OpenCL device's memory (see the module docstring)."""

    __slots__ = ("shape", "dtype", "device", "storage", "host", "__weakref__")

    def __init__(
        self, device: ClDevice, shape: tuple[int, ...], dtype: np.dtype, storage: _Storage
    ) -> None:
        self.device = device
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.storage = storage
        #: a host copy of a small tensor made from host data (shape inputs read without a trip)
        self.host: np.ndarray | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def buffer(self) -> Any:
        """The ``cl.Buffer`` (None for a 0-sized tensor)."""
        block = self.storage.block
        return None if block is None else block.buffer

    def view(self, shape: tuple[int, ...]) -> ClTensor:
        """The same elements under another shape, sharing the storage (no copy)."""
        with self.storage.lock:
            self.storage.refs += 1
        out = ClTensor(self.device, shape, self.dtype, self.storage)
        if self.host is not None:
            out.host = self.host.reshape(shape)
        return out

    def numpy(self) -> np.ndarray:
        """A fresh host copy (waits for every command before it)."""
        return self.device.download(self)

    def release(self) -> None:
        """Drop this tensor's reference; the buffer returns to the pool with the last one."""
        st = self.storage
        with st.lock:
            st.refs -= 1
            last = st.refs == 0
        if not last:
            return
        derived, st.derived = st.derived, None
        for t in (derived or {}).values():
            t.release()
        if st.block is not None:
            block, st.block = st.block, None
            self.device.freed(block)
            block.pool.free(block)

    def derived(self, key: Any, make: Callable[[], ClTensor]) -> ClTensor:
        """A tensor computed from this one by ``make()``, kept until this storage is freed.

        Tensors are never written after they are made, so a derived form (a weight's packed
        panels) stays valid; the caller must not release what this returns.
        """
        st = self.storage
        key = (self.shape, key)  # views of one storage may have other shapes
        with st.lock:
            have = st.derived.get(key) if st.derived else None
        if have is not None:
            return have
        made = make()
        with st.lock:
            if st.derived is None:
                st.derived = {}
            have = st.derived.setdefault(key, made)
        if have is not made:
            made.release()
        return have

    def __repr__(self) -> str:
        return f"ClTensor({self.dtype}{list(self.shape)} on opencl:{self.device.info.index})"


class ClDevice:
    """Context, queue, memory pool and program cache of one OpenCL device."""

    def __init__(self, info: DeviceInfo) -> None:
        import pyopencl as cl

        self.info = info
        self.context = cl.Context([info.device])
        self.queue = cl.CommandQueue(self.context, info.device)
        self.pool = CachingPool(
            f"opencl:{info.index}", capacity=info.global_mem, allocator=self, alignment=128
        )
        from anychip.backends.opencl.driver.programs import ProgramCache

        self.programs = ProgramCache(self)
        self._meta: dict[tuple[int, ...], Any] = {}
        self._meta_lock = threading.Lock()
        #: work-group size for 1-D kernels: what the device allows, at most 256
        self.wg = max(1, min(info.max_work_group, 256))
        #: the second in-order queue host-to-device copies run on (None: they share ``queue``)
        self.copy_queue: Any = None
        #: the last upload's copy event (on ``copy_queue``), for tests and the bench
        self.last_copy: Any = None
        self._epoch = 0  # bumped whenever the compute queue is known to be drained
        self._freed: dict[int, int] = {}  # id(cl.Buffer) -> epoch it was freed in
        #: id(cl.Buffer) -> event of a copy to the host on ``copy_queue`` still reading it
        self.reading: dict[int, Any] = {}
        #: events of such copies whose buffer was released: pyopencl's event of a copy to a
        #: host array waits for the copy when collected, so they are kept until they are done
        self._retired: list[Any] = []
        if os.environ.get("ANYCHIP_OPENCL_COPY_QUEUE") == "1":
            self.use_copy_queue(True)

    def use_copy_queue(self, on: bool = True) -> None:
        """Run host-to-device copies on a second in-order queue (``on``) or on the compute
        queue. With it, an upload overlaps the kernels queued before it where the device runs
        two queues at once (``copy_overlap()`` measures whether it does); a barrier on the
        compute queue waits for the copy's event, so every later kernel sees the data, and a
        copy into a buffer freed since the queue last drained first waits for a marker of the
        compute queue (a queued kernel may still read the old contents)."""
        import pyopencl as cl

        self.finish()
        self.copy_queue = cl.CommandQueue(self.context, self.info.device) if on else None

    def freed(self, block: Block) -> None:
        """Note that ``block`` went back to the pool (see ``use_copy_queue``); a buffer a copy
        to the host still reads is not written by a later kernel before the copy is done."""
        if self.copy_queue is not None:
            self._freed[id(block.buffer)] = self._epoch
            ev = self.reading.pop(id(block.buffer), None)
            if ev is not None:
                import pyopencl as cl

                cl.enqueue_barrier(self.queue, wait_for=[ev])
                done = cl.command_execution_status.COMPLETE
                status = cl.event_info.COMMAND_EXECUTION_STATUS
                self._retired = [e for e in self._retired if e.get_info(status) != done]
                self._retired.append(ev)

    def _drained(self) -> None:
        self._epoch += 1
        self._freed.clear()

    # -- raw allocator for the pool ----------------------------------------------------------
    def _alloc(self, nbytes: int) -> Any:
        import pyopencl as cl

        if nbytes > self.info.max_alloc:
            raise MemoryError(
                f"{nbytes} bytes is more than this device's largest buffer ({self.info.max_alloc})"
            )
        try:
            return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
        except cl.MemoryError as e:
            raise MemoryError(str(e)) from e

    def _free(self, buffer: Any) -> None:
        buffer.release()

    # -- tensors -----------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...] | list[int], dtype: Any) -> ClTensor:
        """An uninitialised tensor from the pool."""
        dt = np.dtype(dtype)
        n = math.prod(int(v) for v in shape) * dt.itemsize
        block = self.pool.alloc(n) if n > 0 else None
        return ClTensor(self, tuple(shape), dt, _Storage(block))

    def upload(self, array: np.ndarray, ordered: bool = True) -> ClTensor:
        """A device copy of a C-contiguous host array (enqueued; in-order queue). With the
        copy queue and ``ordered=False`` the compute queue does not wait for the copy: the
        caller orders it (``streams.ClStreams``)."""
        import pyopencl as cl

        out = self.empty(array.shape, array.dtype)
        if out.buffer is not None:
            host = np.ascontiguousarray(array)
            if self.copy_queue is None:
                cl.enqueue_copy(self.queue, out.buffer, host, is_blocking=False)
            else:
                self._upload_aside(out.buffer, host, ordered)
        if array.size <= 64:
            out.host = np.array(array, copy=True)
        return out

    def _upload_aside(self, buffer: Any, host: np.ndarray, ordered: bool = True) -> None:
        """The copy on the copy queue, ordered with the compute queue by events."""
        import pyopencl as cl

        wait = None
        if self._freed.get(id(buffer)) == self._epoch:  # write after a queued read
            wait = [cl.enqueue_marker(self.queue)]
        ev = cl.enqueue_copy(self.copy_queue, buffer, host, is_blocking=False, wait_for=wait)
        if ordered:
            cl.enqueue_barrier(self.queue, wait_for=[ev])  # later kernels see the data
        self.last_copy = ev

    def download(self, tensor: ClTensor) -> np.ndarray:
        """A fresh host array with the tensor's elements (waits for the copy)."""
        import pyopencl as cl

        out = np.empty(tensor.shape, tensor.dtype)
        if tensor.buffer is not None and out.size:
            cl.enqueue_copy(self.queue, out, tensor.buffer, is_blocking=True)
            self._drained()  # in order: everything queued before the read is done
        return out

    def copy(self, tensor: ClTensor) -> ClTensor:
        """A device-side copy into a new buffer."""
        import pyopencl as cl

        out = self.empty(tensor.shape, tensor.dtype)
        if out.buffer is not None:
            cl.enqueue_copy(self.queue, out.buffer, tensor.buffer, byte_count=tensor.nbytes)
        out.host = tensor.host
        return out

    def meta(self, values: tuple[int, ...]) -> Any:
        """A read-only int32 device buffer holding ``values`` (cached: shapes repeat)."""
        import pyopencl as cl

        buf = self._meta.get(values)
        if buf is not None:
            return buf
        with self._meta_lock:
            if len(self._meta) > 4096:
                self._meta.clear()
            arr = np.asarray(values if values else (0,), np.int32)
            flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
            buf = cl.Buffer(self.context, flags, hostbuf=arr)
            self._meta[values] = buf
        return buf

    def finish(self) -> None:
        """Wait for every enqueued command."""
        self.queue.finish()
        if self.copy_queue is not None:
            self.copy_queue.finish()
        self.reading.clear()
        self._retired.clear()
        self._drained()


#: Why OpenCL is off in this process: a child forked after a context was made (PoCL's and
#: most drivers' threads and device state do not survive fork: the child's first copy waited
#: forever, issue 47). None: usable.
FORKED: list[str | None] = [None]
FORK_REASON = (
    "OpenCL was set up before this process forked, and its driver does not survive fork (the "
    "child's first copy would wait forever); use OpenCL in a process started with the "
    "'spawn' or 'forkserver' method, or set it up only after forking"
)


def _after_fork_in_child() -> None:
    if _DEVICES:
        FORKED[0] = FORK_REASON
        _DEVICES.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def get_device(index: int) -> ClDevice:
    """The ``ClDevice`` of OpenCL device ``index`` (made once per process)."""
    if FORKED[0] is not None:
        raise DeviceError(f"opencl:{index}: {FORKED[0]}")
    dev = _DEVICES.get(index)
    if dev is not None:
        return dev
    with _LOCK:
        if index not in _DEVICES:
            devices, why = find_devices()
            if index >= len(devices):
                raise DeviceError(
                    f"opencl:{index} does not exist: "
                    + (why or f"{len(devices)} OpenCL device(s) here")
                )
            _DEVICES[index] = ClDevice(devices[index])
        return _DEVICES[index]
