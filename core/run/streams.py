"""Copy steps on a device's copy stream, for devices that declare one (``Backend.streams()``).

``stream_copier(src, dst)`` gives the step function of a host<->device copy to a device whose
``streams()`` is not None, else None (the step keeps the synchronous ``to_device``/``to_host``):

* host to device: ``copy_in`` on ``COPY``, then the compute stream waits for an event recorded
  after it, so the partition's kernels see the data while the host goes on issuing;
* device to host: the copy stream waits for an event of the compute stream (the kernels that
  wrote the tensor), ``copy_out`` on ``COPY``, and the step returns the host array with the
  ``synchronize`` of an event recorded after the copy. ``StepProgram`` calls it before the first
  step that reads the array on the host, and before returning it.

Invariant: no host code reads an array of a ``copy_out`` before its event was synchronized
(``StepProgram`` keeps the pending ones per run, and synchronizes them all when a run fails).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from anychip.core.plugin.streams import COMPUTE, COPY
from anychip.errors import AnychipError, DeviceError

__all__ = ["stream_copier"]


def stream_copier(src: Any, dst: Any) -> tuple[Callable[[Any], Any], bool] | None:
    """``(fn, pending)`` for a copy from backend ``src`` to ``dst`` through a declared copy
    stream, or None. ``pending``: ``fn`` returns ``(array, synchronize)`` (a download)."""
    if src.host_memory and not dst.host_memory:
        streams = dst.streams()
        if streams is not None:
            return partial(_upload, dst.name, streams), False
    if dst.host_memory and not src.host_memory:
        streams = src.streams()
        if streams is not None:
            return partial(_download, src.name, streams), True
    return None


def _upload(name: str, streams: Any, array: Any) -> Any:
    try:
        tensor = streams.copy_in(np.asarray(array, order="C"))
        streams.wait(streams.record(COPY), COMPUTE)
    except AnychipError:
        raise
    except Exception as e:
        raise DeviceError(
            f"{name}: copy to device on the copy stream of {array.dtype}{list(array.shape)} "
            f"failed: {e}"
        ) from e
    return tensor


def _download(name: str, streams: Any, tensor: Any) -> tuple[np.ndarray, Callable[[], None]]:
    try:
        streams.wait(streams.record(COMPUTE), COPY)
        out = streams.copy_out(tensor)
        done = streams.record(COPY)
    except AnychipError:
        raise
    except Exception as e:
        raise DeviceError(f"{name}: copy to host on the copy stream failed: {e}") from e
    return out, partial(_synchronize, name, streams, done)


def _synchronize(name: str, streams: Any, event: Any) -> None:
    try:
        streams.synchronize(event)
    except AnychipError:
        raise
    except Exception as e:
        raise DeviceError(f"{name}: waiting for a copy to host failed: {e}") from e
