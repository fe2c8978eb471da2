"""CUDA-graph capture and replay of a static-shape partition (written for a GPU; this code path
has never run on one: no machine of this project has a GPU, see README's device table).

``CapturedPartition(program, state, examples)`` runs ``program`` (a kernel-mode partition's
callable over device tensors) once to warm CuPy's caches, then once more inside
``stream.begin_capture()``/``end_capture()`` on static input buffers, and keeps the resulting
``cupy.cuda.Graph``. Each call copies the new inputs into the static buffers, launches the
graph (one launch for the whole partition instead of one per kernel) and returns copies of the
static outputs (the next replay overwrites them). Every block allocated during the capture is
kept alive (``CupyPool.hold``): its address is baked into the graph, so the pool must never
hand it out again. Shapes must not change: a call with other shapes raises, and the caller
runs the partition normally.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from anychip.errors import KernelError

__all__ = ["CapturedPartition", "ReplayedPartition", "signature", "WARMUP"]

#: Plain runs of a static partition before it is captured (CuPy's kernel and pool caches warm)
WARMUP = 2


def signature(tensors: Sequence[Any]) -> tuple:
    """What a capture is valid for: each input's shape and dtype."""
    return tuple((tuple(t.shape), str(t.dtype)) for t in tensors)


class CapturedPartition:
    """A partition's kernels captured as one CUDA graph (see the module docstring)."""

    def __init__(
        self, program: Callable[[list[Any]], list[Any]], state: Any, examples: list[Any]
    ) -> None:
        cp = state.cupy
        self.state = state
        self.program = program
        self.key = signature(examples)
        with state.scope():
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.inputs = [state.space.wrap(cp.array(t.array, copy=True)) for t in examples]
            for t in program(self.inputs):  # warm-up: kernels compiled, pool blocks cached
                t.release()
            with state.pool.hold() as self._held, self.stream:
                self.stream.begin_capture()
                try:
                    self.outputs = program(self.inputs)
                finally:
                    self.graph = self.stream.end_capture()

    def __call__(self, tensors: list[Any]) -> list[Any]:
        if signature(tensors) != self.key:
            raise KernelError(
                f"a CUDA graph captured for {self.key} called with {signature(tensors)}"
            )
        s = self.state
        with s.scope(), self.stream:
            for static, new in zip(self.inputs, tensors):
                static.array[...] = new.array
            self.graph.launch(self.stream)
            outs = [s.space.wrap(o.array.copy()) for o in self.outputs]
            self.stream.synchronize()
        return outs


log = logging.getLogger("anychip")


class ReplayedPartition:
    """A static-shape kernel-mode partition as the CUDA backend runs it
    (``CudaBackend.runner``): ``WARMUP`` plain runs, then one capture as a CUDA graph
    (``CapturedPartition``) replayed on every later call with the same shapes. Other shapes,
    ``ANYCHIP_CUDA_GRAPHS=0``, or a capture that fails (said once in the log, and kept in
    ``failed``) run the partition normally."""

    def __init__(self, program: Callable[[list[Any]], list[Any]], state: Callable[[], Any]):
        self.program, self._state = program, state
        self.calls = 0
        self.replays = 0
        self.captured: CapturedPartition | None = None
        self.failed: str | None = None

    def __call__(self, tensors: list[Any]) -> list[Any]:
        cap = self.captured
        if cap is not None and signature(tensors) == cap.key:
            self.replays += 1
            return cap(tensors)
        self.calls += 1
        if (
            cap is None
            and self.failed is None
            and self.calls > WARMUP
            and os.environ.get("ANYCHIP_CUDA_GRAPHS", "1") != "0"
        ):
            try:
                self.captured = CapturedPartition(self.program, self._state(), tensors)
            except Exception as e:
                self.failed = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
                log.info("anychip: CUDA-graph capture failed, running kernels: %s", self.failed)
            else:
                self.replays += 1
                return self.captured(tensors)
        return self.program(tensors)
