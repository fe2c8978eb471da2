"""A static-shape host partition's kernel calls recorded once and replayed without the per-node
Python (the CPU's counterpart of ``backends/cuda/graphs.py``'s CUDA graphs, and of tinygrad's
``TinyJit``). This module is what kernels call while a run is recorded (``note``, ``seal``,
``empty``, ``decide``); ``backends/cpu/replay/run.py`` records, checks and replays.

Between its kernels a warm run of a small CNN spends a fifth to a quarter of its time in
Python: the dispatch loop, each kernel's checks of its remembered path, its OpenMP switches
and cffi's argument conversions (about 9 us a convolution node whose C call takes 5). Once a
partition has run ``RECORD_AT`` times with the same input shapes and threads, its next runs
*record* it, one step a request (``replay_run.STEPS``, ``replay_run._Recording``; each request is
answered by a run on its own inputs and runs at most one run of the check besides), on private
copies of the inputs and a private arena:

1. Two *dry* passes run the kernels as usual while every buffer they ask for through
   ``empty`` is timed: when it was made and when Python dropped it (``weakref.finalize``),
   in events. The first pass only settles the kernels' remembered paths (``decide``: while
   recorded, the pool's backoff does not change a kernel's path).
2. ``Recorder.plan`` places those buffers in one block with ``core/memory/planner.py``:
   buffers alive at the same time apart, the others sharing bytes as numpy's reuse of freed
   memory had them. (Kept apart, each in its own allocation, a replay's working set grew
   from the plan's few hundred KiB to megabytes, and ShuffleNet replayed 5% *slower*
   than the kernels.)
3. The *recorded* pass runs the kernels again, their buffers at the planned offsets (the
   same instruction must ask for the same sizes, else the recording is dropped), while they
   note the calls that did their work (``note``: the function and its arguments, cffi
   pointers that keep their arrays alive) with the thread state they ran under (the
   ``replay/state.py``: the OpenMP team, the pool's pause). A kernel whose whole
   effect was the calls it noted says so (``seal``): convolutions, products, pools,
   shuffles, concats, normalizations, attention, recurrences, generated element-wise chains
   (and a view kernel that made only views, ``replay_run._views_of``). The other
   instructions are kept as they were called (arguments, planned output, results) to run
   again through their kernels (``replay_run._Rerun``).
4. The *check*, over two requests: the kernels run on the inputs reversed (the same values
   elsewhere, so a buffer no call writes again, or bytes shared while still read, show), then
   the trace is replayed on them and must give the kernels' answer (``_differs``), in under
   ``GAIN`` of their time; the second request is then answered by the checked replay.

Later runs with the same shapes and threads *replay*: the feeds are copied into the private
inputs, the steps run in one flat loop (the thread state switched only where it changes), a
re-run instruction's result that lands elsewhere is copied where the recorded readers look,
and the outputs are copied out (the next replay overwrites them). A replay holds the trace's
lock: a second thread running the same partition meanwhile takes the usual path.

What a replay does not do, and where that matters:

* It reads the initializers where they were when recorded; a kernel's own check for weights
  rewritten in place (``_memo.Remembered.prepared``) is not made again.
* It keeps its block, the private arena and inputs, and the arrays the calls read (a few MiB
  for the small CNNs: the partition's info says how many). A trace that would keep more than
  ``MAX_BYTES``, or in which fewer than half the nodes are sealed, is not kept, and the
  partition runs as before (``off``); so is a partition whose nodes took over ``SLOW_NODE``
  each (the Python saved is noise there).
* A replay measured slower than the kernels (the machine may have been busy) is not kept and
  recorded again ``RETRY`` runs later, doubling up to ``MAX_WAIT``. A replayed call that
  raises drops the trace; the run takes the kernels' path (which names the node if it fails).
* Kernels' path counters (``onednn.kernels.RUNS``, ``_prim.REORDERS``) do not count replayed
  calls, and a recording runs the kernels five times (over its five requests).
* Profiling (``Session.profile``) and a shape or thread count not recorded take the usual
  path; so does everything with ``ANYCHIP_REPLAY=0`` or ``device_options={"cpu":
  {"replay": False}}``.
* Partitions fed non-array values are not recorded; nodes with nested graphs (ShapeMemo,
  If, Loop) re-run through their kernels, on the frame of slots they saw when recorded.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "Recorder",
    "note",
    "seal",
    "unseal",
    "hold",
    "empty",
    "copy",
    "contiguous",
    "decide",
    "recording",
    "under",
    "ACTIVE",
]

#: Recorders running in any thread (checked before the thread-local lookup).
ACTIVE = 0
_local = threading.local()
_active_lock = threading.Lock()


class Recorder:
    """The calls noted while one instruction runs, and whether its kernel sealed them; the
    buffers kernels ask for through ``empty``: on a first, dry pass made by numpy and timed
    (``lifetimes``: when each was made and dropped, in events), on the recorded pass placed
    in one block at the offsets ``plan`` gives them (``offsets``, in the same order)."""

    __slots__ = (
        "steps", "sealed", "capture", "lifetimes", "clock", "block", "offsets", "broken", "held",
        "node",
    )  # fmt: skip

    def __init__(
        self, capture: Callable[[], Any], block: np.ndarray | None = None, offsets: Any = None
    ) -> None:
        self.steps: list[tuple[Any, tuple, Any]] = []
        self.sealed = False
        self.capture = capture
        self.lifetimes: list[list[Any]] = []
        self.clock = 0
        self.block, self.offsets = block, offsets
        self.broken = ""
        self.held: list[Any] = []
        self.node = 0  # instructions ended so far (the hooks count them)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        k = len(self.lifetimes)
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if self.block is not None:
            self.lifetimes.append([nbytes])
            if k >= len(self.offsets) or self.offsets[k][1:] != (nbytes, self.node):
                self.broken = "a kernel asked for other buffers than on the first run"
                return np.empty(shape, dtype)
            off = self.offsets[k][0]
            return self.block[off : off + nbytes].view(dtype).reshape(shape)
        a = np.empty(shape, dtype)
        self.lifetimes.append([nbytes, self.clock, None, self.node])
        self.clock += 1
        weakref.finalize(a, self._dropped, k)
        return a

    def _dropped(self, k: int) -> None:
        self.lifetimes[k][2] = self.clock
        self.clock += 1

    def plan(self) -> tuple[list[tuple[int, int, int]], int]:
        """The dry pass's buffers placed in one block: ``[(offset, bytes, node)]`` in the
        order they were asked for (``node``: the instruction that asked), and its size
        (``core/memory/planner.py``: buffers alive at the same time apart, the others sharing
        bytes as numpy's reuse of freed memory had them, so a replay's working set stays as
        small and as warm)."""
        from anychip.core.memory.planner import plan_memory

        end = self.clock + 1
        ts = [(k, n, t0, (t1 if t1 is not None else end) - 1) for k, (n, t0, t1, _) in
              enumerate(self.lifetimes)]  # fmt: skip
        if not ts:
            return [], 0
        plan = plan_memory(ts, alignment=64)
        nodes = [life[3] for life in self.lifetimes]
        return [(plan.offsets[k], n, i) for (k, n, _, _), i in zip(ts, nodes)], plan.total_size


def decide(ask: Callable[[], Any], recorded: Any) -> Any:
    """``ask()``, a kernel's choice of path that may change from call to call (the pool
    backing off under load), or ``recorded`` while a run is recorded: every pass of a
    recording takes the same paths (and a replay, the one its calls were made for)."""
    return ask() if (getattr(_local, "rec", None) if ACTIVE else None) is None else recorded


def empty(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """``np.empty(shape, dtype)`` for a buffer a kernel writes by noted calls; while a run is
    recorded, a buffer of the recorder's (``Recorder.empty``)."""
    rec = getattr(_local, "rec", None) if ACTIVE else None
    return np.empty(shape, dtype) if rec is None else rec.empty(tuple(shape), dtype)


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)``, noted while a run is recorded: a kernel's copy a replay makes
    again."""
    np.copyto(dst, src)
    if ACTIVE:
        note(np.copyto, (dst, src))


def contiguous(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    """``a`` as a C-contiguous array of ``dtype`` (``a``'s by default): itself where it is
    one, else a copy into ``empty``'s buffer made by ``copy`` (noted)."""
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    if a.dtype == dtype and a.flags.c_contiguous:
        return a
    c = empty(a.shape, dtype)
    copy(c, a)
    return c


def recording() -> Recorder | None:
    """The recorder of this thread, or None (the usual case: one global read)."""
    return getattr(_local, "rec", None) if ACTIVE else None


def note(fn: Callable[..., Any], args: tuple) -> None:
    """Record ``fn(*args)``, just called by a kernel, with the thread state it ran under.
    ``fn`` must do the same work when called again with ``args`` (addresses, cffi pointers
    and arrays that stay where they are), raising on failure."""
    rec = getattr(_local, "rec", None) if ACTIVE else None
    if rec is not None:
        rec.steps.append((fn, args, rec.capture()))


def hold(obj: Any) -> None:
    """Keep ``obj`` alive as long as the trace being recorded (arrays a note gave as
    addresses)."""
    rec = getattr(_local, "rec", None) if ACTIVE else None
    if rec is not None:
        rec.held.append(obj)


def unseal() -> None:
    """Say that the running instruction did work it did not note after a callee sealed (it
    re-runs through its kernel)."""
    rec = getattr(_local, "rec", None) if ACTIVE else None
    if rec is not None:
        rec.sealed = False


def seal() -> None:
    """Say that the running instruction's whole effect was the calls it noted (its result
    an array those calls wrote, or a view of one): a replay runs only those."""
    rec = getattr(_local, "rec", None) if ACTIVE else None
    if rec is not None:
        rec.sealed = True


def under(rec: Recorder, fn: Callable[[], list[Any]]) -> list[Any]:
    """``fn()`` with ``rec`` this thread's recorder."""
    global ACTIVE
    with _active_lock:
        ACTIVE += 1
    _local.rec = rec
    try:
        return fn()
    finally:
        _local.rec = None
        with _active_lock:
            ACTIVE -= 1
