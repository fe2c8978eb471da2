"""The OpenCL device's streams (``core/plugin/streams.Streams``): its compute queue and a
second in-order queue for copies (``ClDevice.copy_queue``), events from ``cl.enqueue_marker``
and device-side waits from ``cl.enqueue_barrier(queue, wait_for=[event])``.

Opt-in (``device_options={"opencl": {"streams": True}}`` or ``ANYCHIP_OPENCL_STREAMS=1``): on
PoCL over the host's cores the second queue measured no gain (docs/decisions/043), and a GPU
driver that runs two queues at once gains only with pinned host memory, which this driver
does not allocate yet.

Invariants (the contract's): an upload into a buffer freed while a queued kernel may still read
it waits for a marker of the compute queue (``ClDevice._upload_aside``); a buffer a download on
the copy queue still reads is released behind a compute-queue barrier on the download's event
(``ClDevice.freed``), so no later kernel overwrites it first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.core.plugin.streams import COMPUTE, COPY, Streams
from anychip.errors import DeviceError

__all__ = ["ClStreams"]


class ClStreams(Streams):
    """The two queues of ``device`` (a ``ClDevice``; its copy queue is made if missing)."""

    def __init__(self, device: Any) -> None:
        if device.copy_queue is None:
            device.use_copy_queue(True)
        self.device = device

    def _queue(self, stream: str) -> Any:
        d = self.device
        if stream == COMPUTE:
            return d.queue
        if stream == COPY and d.copy_queue is not None:
            return d.copy_queue
        raise DeviceError(
            f"opencl:{d.info.index}: no stream {stream!r} (the copy queue was turned off with "
            "use_copy_queue(False) while streams were in use; turn it back on)"
        )

    def copy_in(self, array: np.ndarray) -> Any:
        self._queue(COPY)
        return self.device.upload(array, ordered=False)

    def copy_out(self, tensor: Any) -> np.ndarray:
        import pyopencl as cl

        queue = self._queue(COPY)
        out = np.empty(tensor.shape, tensor.dtype)
        if tensor.buffer is not None and out.size:
            ev = cl.enqueue_copy(queue, out, tensor.buffer, is_blocking=False)
            self.device.reading[id(tensor.buffer)] = ev
        return out

    def record(self, stream: str) -> Any:
        import pyopencl as cl

        return cl.enqueue_marker(self._queue(stream))

    def wait(self, event: Any, stream: str) -> None:
        import pyopencl as cl

        cl.enqueue_barrier(self._queue(stream), wait_for=[event])

    def synchronize(self, event: Any = None) -> None:
        if event is None:
            self.device.finish()
        else:
            event.wait()
