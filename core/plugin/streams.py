"""The optional stream/event contract: copies on a queue of their own, ordered by events.

A device that can run a copy while a kernel runs declares it by returning a ``Streams`` from
``Backend.streams()`` (None, the default, keeps today's synchronous copies). A session then
issues each of its host<->device copies to that device on the copy stream and orders them with
the compute stream by events (``core/run/streams.py``), the shape of CUDA's streams and events,
PJRT's buffer-ready events and onnxruntime's ``Stream``/``Notification``, kept to five methods:

* ``copy_in(array)``: issue a host-to-device copy on the copy stream, return the device tensor
  (its data is there once an event recorded on the copy stream after it completes);
* ``copy_out(tensor)``: issue a device-to-host copy on the copy stream, return the host array it
  fills (read it only after ``synchronize`` of an event recorded on the copy stream after it);
* ``record(stream)``: an event marking everything issued on ``stream`` so far;
* ``wait(event, stream)``: what is issued on ``stream`` from now on starts after ``event``
  (device side: the host does not block);
* ``synchronize(event=None)``: the host blocks until ``event`` (or everything issued) is done.

The two streams are named ``COMPUTE`` (where the device's kernels run, in issue order) and
``COPY``. Invariants a declaring backend keeps (the kit's ``streams`` check tries them):
    * ``copy_in`` keeps its host array alive until the copy is done, and a buffer released while
      a kernel queued before may still read it is not overwritten by a later copy before that
      kernel ran;
    * a tensor released while a ``copy_out`` still reads it is not handed to a later kernel's
      output before the copy is done (CUDA's ``record_stream`` rule);
    * events are opaque to the runtime; waiting on a completed event is free.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["COMPUTE", "COPY", "Streams"]

#: The stream a device's kernels run on, in the order they are issued.
COMPUTE = "compute"
#: The stream copies between the host and the device run on.
COPY = "copy"


class Streams:
    """A device's copy and compute streams and their events (see the module docstring).

    Subclass it and fill in the five methods; ``Backend.streams()`` returns the instance.
    """

    def copy_in(self, array: np.ndarray) -> Any:
        """Issue a copy of the C-contiguous ``array`` to the device on ``COPY``; the tensor."""
        raise NotImplementedError

    def copy_out(self, tensor: Any) -> np.ndarray:
        """Issue a copy of ``tensor`` to a fresh host array on ``COPY``; that array."""
        raise NotImplementedError

    def record(self, stream: str) -> Any:
        """An event: done when everything issued on ``stream`` so far is done."""
        raise NotImplementedError

    def wait(self, event: Any, stream: str) -> None:
        """Make what is issued on ``stream`` from now on start after ``event``."""
        raise NotImplementedError

    def synchronize(self, event: Any = None) -> None:
        """Block the host until ``event`` is done (every stream's work when None)."""
        raise NotImplementedError
