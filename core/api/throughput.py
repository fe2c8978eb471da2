"""Throughput mode: several requests in flight over several sessions (OpenVINO's
``AsyncInferQueue``, onnxruntime's concurrent sessions).

A ``Session`` serialises its runs (one lock: ``core/api/session.py``), so requests overlap
only across sessions. ``InferQueue(sessions)`` runs each request on the session idle the
longest (a FIFO of idle sessions: requests rotate over them), one worker thread per session;
``InferQueue.spread(model, devices)`` makes one session per device (each with the cpu as its
fallback, or the cpu alone), so requests run on the devices side by side rather than split
node by node: the better mode when requests are many and each fits one device.

    queue = anychip.InferQueue.spread("model.onnx", ["npu", "cpu"])
    futures = [queue.start_async({"x": x}) for x in batches]
    outputs = [f.result() for f in futures]
    queue.close()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from anychip.errors import AnychipError

__all__ = ["InferQueue"]

Callback = Callable[[list[Any] | None, Any, str], None]


class InferQueue:
    """Requests over ``sessions``, one in flight per session (see the module docstring).

    ``start_async(feeds, userdata)`` returns a ``Future`` of the outputs (and calls the
    callback ``set_callback`` gave: ``callback(outputs, userdata, error)``); ``wait_all()``
    waits for every request started; ``served`` counts the requests each session ran.
    """

    def __init__(self, sessions: Sequence[Any]) -> None:
        if not sessions:
            raise AnychipError("InferQueue needs at least one session")
        self.sessions = list(sessions)
        self.served = [0] * len(self.sessions)
        self._idle: queue.Queue[int] = queue.Queue()
        for i in range(len(self.sessions)):
            self._idle.put(i)
        self._pool = ThreadPoolExecutor(len(self.sessions), thread_name_prefix="anychip-queue")
        self._callback: Callback | None = None
        self._pending: list[Future] = []
        self._lock = threading.Lock()

    @classmethod
    def spread(
        cls, model: Any, devices: Sequence[str], jobs_per_device: int = 1, **options: Any
    ) -> InferQueue:
        """One session per device of ``devices`` (``jobs_per_device`` each), ``options`` as
        for ``anychip.load``; a device other than the cpu keeps the cpu as its fallback."""
        from anychip.core.api.session import load

        if jobs_per_device < 1:
            raise AnychipError(f"jobs_per_device must be >= 1, got {jobs_per_device}")
        data = model
        if not isinstance(model, (str, bytes)) and hasattr(model, "SerializeToString"):
            data = model.SerializeToString()  # read once, loaded per session
        sessions = [
            load(data, devices=[d] if d == "cpu" else [d, "cpu"], **options)
            for d in devices
            for _ in range(jobs_per_device)
        ]
        return cls(sessions)

    def set_callback(self, callback: Callback | None) -> None:
        """``callback(outputs, userdata, error)`` after each request ("" when it ran)."""
        self._callback = callback

    def start_async(
        self, feeds: Mapping[str, Any], userdata: Any = None,
        output_names: Sequence[str] | None = None,
    ) -> Future:  # fmt: skip
        """Queue one request; its outputs (or its error) in the returned ``Future``."""
        future = self._pool.submit(self._one, dict(feeds), output_names)
        callback = self._callback
        if callback is not None:

            def done(f: Future) -> None:
                err = f.exception()
                callback(None if err else f.result(), userdata, "" if err is None else str(err))

            future.add_done_callback(done)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def _one(self, feeds: dict[str, Any], output_names: Sequence[str] | None) -> list[Any]:
        i = self._idle.get()  # the session idle the longest
        try:
            self.served[i] += 1
            return list(self.sessions[i].run(output_names, feeds))
        finally:
            self._idle.put(i)

    def wait_all(self) -> None:
        """Wait for every request started so far (errors stay in their futures)."""
        with self._lock:
            pending = list(self._pending)
        for f in pending:
            f.exception()

    def close(self) -> None:
        """Finish the requests, then close every session."""
        self._pool.shutdown(wait=True)
        for s in self.sessions:
            s.close()

    def __enter__(self) -> InferQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
