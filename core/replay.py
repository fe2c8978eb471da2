"""A static-shape host partition's kernel calls recorded once and replayed without the per-node
Python (the CPU's counterpart of ``backends/cuda/graphs.py``'s CUDA graphs, and of tinygrad's
``TinyJit``).

Between its kernels a warm run of a small CNN spends a fifth to a quarter of its time in
Python: the dispatch loop, each kernel's checks of its remembered path, its OpenMP switches
and cffi's argument conversions (about 9 us a convolution node whose C call takes 5). Once a
partition has run ``RECORD_AT`` times with the same input shapes and threads, its next run is
*recorded*, on private copies of the inputs and a private arena:

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
   backend's ``replay_state``: the OpenMP team, the pool's pause). A kernel whose whole
   effect was the calls it noted says so (``seal``): remembered convolutions and 1x1
   products, depthwise convolutions, shuffles, pools, concats, generated element-wise
   chains. The other instructions are kept as they were called (arguments, planned output,
   results) to run again through their kernels (``_Rerun``).
4. The *check*: the trace is replayed on the inputs reversed (the same values elsewhere, so
   a buffer no call writes again, or bytes shared while still read, show) and must give the
   kernels' answer on them (``_differs``), in under ``GAIN`` of their time.

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
  recorded again ``RETRY`` runs later, doubling up to ``MAX_WAIT``.
* Kernels' path counters (``onednn.kernels.RUNS``, ``_prim.REORDERS``) do not count replayed
  calls, and a recording runs the kernels five times.
* Profiling (``Session.profile``) and a shape or thread count not recorded take the usual
  path; so does everything with ``ANYCHIP_REPLAY=0`` or ``device_options={"cpu":
  {"replay": False}}``.
* Partitions fed non-array values are not recorded; nodes with nested graphs (ShapeMemo,
  If, Loop) re-run through their kernels, on the frame of slots they saw when recorded.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from anychip.core.executor import Program
    from anychip.core.kernel_call import Instr

__all__ = [
    "Replay",
    "note",
    "seal",
    "unseal",
    "hold",
    "empty",
    "decide",
    "recording",
    "RECORD_AT",
    "MAX_BYTES",
    "ACTIVE",
]

#: Runs with the same input shapes and threads before the next is recorded (a kernel
#: remembers its fast path on its first run; ``thread_choice`` warms both thread counts).
RECORD_AT = 3
#: Seconds a node takes on average (the fastest run before recording) from which a partition
#: is not recorded: a replay saves the few us of Python each node costs, and memory is kept.
SLOW_NODE = 5e-3
#: A trace is kept only where its replay took under this share of the kernels' time.
GAIN = 0.98
#: Runs after a recording dropped for the machine's sake before the next (doubling with
#: each try, up to ``MAX_WAIT``).
RETRY = 8
MAX_WAIT = 1000
#: Bytes a trace may keep alive (its arena, inputs and kernel-made arrays).
MAX_BYTES = 256 << 20
#: Traces kept per partition (one per input signature and thread count). A trace is kept
#: only where at least half the nodes are recorded calls (the others cost their kernels' path
#: and a check of where their results went: a wash where most nodes are so).
MAX_TRACES = 4

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


class _Rerun:
    """An instruction replayed through its kernel, on the arguments and planned output it
    was recorded with (a node with nested graphs, ShapeMemo's or an If's, on the frame of
    slots it saw: the recorded arrays); results landing elsewhere are copied into the
    recorded arrays."""

    __slots__ = ("ins", "args", "out", "targets", "frame")

    def __init__(
        self, ins: Instr, args: list[Any], out: Any, targets: list[Any], frame: list | None
    ) -> None:
        self.ins, self.args, self.out, self.targets = ins, args, out, targets
        self.frame = frame

    def __call__(self) -> None:
        ins = self.ins
        if self.frame is not None:
            ins.ctx._frame = self.frame
        if self.out is None:
            res = ins.fn(*self.args, **ins.attrs)
        else:
            res = ins.fn(*self.args, out=self.out, **ins.attrs)
        results = res if type(res) is tuple or type(res) is list else (res,)
        for r, t in zip(results, self.targets):
            if r is t or t is None:
                continue
            if type(r) is not np.ndarray or r.shape != t.shape or r.dtype != t.dtype:
                raise _Stale(f"node {ins.node.name!r} returned another shape or type")
            if r.__array_interface__ != t.__array_interface__:
                np.copyto(t, r)


class _Stale(Exception):
    """The trace no longer matches what the kernels do: run as usual, record no more."""


class Trace:
    """One recorded run: the private inputs, the steps, the outputs and what they keep."""

    __slots__ = ("inputs", "steps", "outputs", "keep", "sealed", "total", "nbytes")

    def __init__(self) -> None:
        self.inputs: list[np.ndarray] = []
        self.steps: list[tuple[Any, tuple, Any]] = []
        self.outputs: list[np.ndarray] = []
        self.keep: list[Any] = []
        self.sealed = self.total = self.nbytes = 0

    def play(self, feeds: Sequence[Any], state: Any, apply: Callable[[Any, Any], None]) -> list:
        for own, t in zip(self.inputs, feeds):
            np.copyto(own, t)
        cur = entry = state
        try:
            for fn, args, st in self.steps:
                if st != cur and st is not None:
                    apply(st, cur)
                    cur = st
                fn(*args)
        finally:
            if cur != entry:
                apply(entry, cur)
        return [o.copy() for o in self.outputs]


def _bytes(values: Sequence[Any]) -> int:
    seen: dict[int, int] = {}
    for v in values:
        if type(v) is np.ndarray:
            base = v
            while isinstance(base.base, np.ndarray):
                base = base.base
            seen[id(base)] = base.nbytes
    return sum(seen.values())


class Replay:
    """A partition's traces (module docstring): ``run`` returns the outputs of a replay, or
    None where the caller should run the partition as usual (then perhaps recording)."""

    def __init__(
        self,
        program: Program,
        capture: Callable[[], Any],
        apply: Callable[[Any, Any], None],
        arena_for: Callable[[Sequence[Any]], tuple[Callable[[np.ndarray], Any] | None, int]],
    ) -> None:
        self.program = program
        self.capture, self.apply = capture, apply
        #: The planned arena's views and size for a run's inputs (``PartitionMemory``).
        self.arena_for = arena_for
        self.traces: dict[tuple, Trace] = {}
        self.seen: dict[tuple, int] = {}
        self.tries: dict[tuple, int] = {}
        self.lock = threading.Lock()
        self.suspended = 0
        self.info: dict[str, Any] = {}
        self.off = os.environ.get("ANYCHIP_REPLAY", "1") == "0" or not _recordable(program)
        #: The fastest of the usual runs before a recording (seconds).
        self.fastest = math.inf

    def run(self, inputs: Sequence[Any], usual: Callable[[Sequence[Any]], list[Any]]) -> list:
        """The partition's outputs: replayed, recorded, or ``usual(inputs)`` (timed on the
        runs before a recording: ``SLOW_NODE``)."""
        if self.off or self.suspended:
            return usual(inputs)
        state = self.capture()
        key = (state, *((t.shape, t.dtype) if type(t) is np.ndarray else None for t in inputs))
        trace = self.traces.get(key)
        if trace is None:
            count = self.seen.get(key, 0) + 1
            if count > RECORD_AT or None in key or len(self.seen) > 4 * MAX_TRACES:
                return usual(inputs)  # dropped, not arrays, or too many signatures
            self.seen[key] = count
            if count < RECORD_AT:
                t0 = time.perf_counter()
                outs = usual(inputs)
                self.fastest = min(self.fastest, time.perf_counter() - t0)
                return outs
            per_node = self.fastest / len(self.program.instrs)
            if per_node > SLOW_NODE:
                self.off = True
                self.info["replay"] = (
                    f"off: its nodes take {per_node * 1e3:.1f} ms each, where the per-node "
                    "Python a replay saves is a few us"
                )
                return usual(inputs)
            if not self.lock.acquire(blocking=False):
                return usual(inputs)
            try:
                return self._record(key, inputs, state)
            finally:
                self.lock.release()
        if not self.lock.acquire(blocking=False):
            return usual(inputs)  # another thread replays: this one takes the kernels' path
        try:
            return trace.play(inputs, state, self.apply)
        except _Stale as e:
            self._drop(key, f"dropped: {e}")
        finally:
            self.lock.release()
        return usual(inputs)

    def _drop(self, key: tuple, why: str, again: bool = False) -> None:
        """No trace for ``key``; where ``again`` (a replay measured slower, or passes that
        took other paths: both can be the machine's load) recorded again later, after
        ``RETRY`` runs doubling with each try up to ``MAX_WAIT``."""
        self.traces.pop(key, None)
        tries = self.tries[key] = self.tries.get(key, 0) + 1
        wait = min(MAX_WAIT, RETRY << (tries - 1))
        self.seen[key] = RECORD_AT - wait if again else RECORD_AT + 1
        self.info["replay"] = why + (f" (recorded again in {wait} runs)" if again else "")

    def _record(self, key: tuple, inputs: Sequence[Any], state: Any) -> list[Any]:
        """Runs on private inputs and arena: two dry ones (the second timing the buffers the
        kernels ask for; the first may leave kernels on other remembered paths than the last
        usual run, ``decide``), then the recorded one with those buffers placed by
        ``Recorder.plan``, then the check of ``_differs``."""
        program = self.program
        # a copy per pass: kernels may write over a partition's inputs (in place)
        dry_in = [np.array(t, copy=True, order="C") for t in inputs]
        own = [np.array(t, copy=True, order="C") for t in inputs]
        views, nbytes = self.arena_for(inputs)
        raw = np.empty(nbytes, np.uint8) if views is not None else None
        arena = views(raw) if views is not None else None
        for _ in range(2):  # the first may leave kernels other remembered paths (``decide``)
            dry = Recorder(self.capture)
            feeds = [t.copy() for t in dry_in]
            _under(dry, lambda: program.run(feeds, arena=arena, hook=_forget(dry)))  # noqa: B023
        offsets, size = dry.plan()
        rec = Recorder(self.capture, np.empty(size, np.uint8), offsets)
        trace = Trace()
        trace.inputs = own
        hook = _Hook(trace, rec)
        outs = _under(rec, lambda: program.run(own, arena=arena, hook=hook))
        trace.outputs = [o for o in hook.final(program) if type(o) is np.ndarray]
        trace.keep += [raw, rec.block, rec.held]
        trace.nbytes = _bytes(trace.keep + trace.inputs + trace.outputs)
        if len(trace.outputs) != len(outs) or rec.broken:
            why = rec.broken or "outputs that are not arrays"
            self._drop(key, f"not recorded: {why}", again=rec.broken != "")
            return outs
        if trace.nbytes > MAX_BYTES or trace.sealed * 2 < trace.total:
            self.off = True  # so for every signature: the partition runs as before
            self._drop(key, f"not kept: {trace.sealed} of {trace.total} nodes are recorded calls"
                       if trace.nbytes <= MAX_BYTES else
                       f"not kept: the trace would hold {trace.nbytes >> 20} MiB")  # fmt: skip
            return outs
        first = [o.copy() for o in trace.outputs]  # the check below replays over them
        why = _differs(program, trace, state, self.apply)
        if why:  # slower (measured again later: the machine may have been busy), or wrong
            self._drop(key, f"not kept: {why}", again=why.startswith("its replay took"))
            return first
        if len(self.traces) >= MAX_TRACES:
            self.traces.pop(next(iter(self.traces)))
        self.traces[key] = trace
        self.info["replay"] = (
            f"{trace.sealed} of {trace.total} nodes replayed as {len(trace.steps)} recorded "
            f"calls (the others through their kernels); holds {trace.nbytes >> 10} KiB"
        )
        return first


def _differs(program: Program, trace: Trace, state: Any, apply: Callable) -> str:
    """Why the trace may not be kept, '' when it may: its replay on a check input (the
    inputs reversed: the same values elsewhere, so a buffer not written again, or bytes
    shared while still read, show) must give the kernels' answer on it, and in less time
    (the better of two runs each, alternated: ``GAIN``)."""
    check = [np.flip(t).copy() for t in trace.inputs]
    best = [math.inf, math.inf]
    for _ in range(2):
        t0 = time.perf_counter()
        try:  # reversed token ids or masks are still in range; a model may refuse them
            want = program.run([t.copy() for t in check])
        except Exception as e:  # noqa: BLE001 - the reason the trace is not kept
            return f"the kernels refused the check input ({type(e).__name__})"
        t1 = time.perf_counter()
        try:
            got = trace.play(check, state, apply)
        except _Stale as e:
            return str(e)
        t2 = time.perf_counter()
        best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
    for g, w in zip(got, want):
        w = np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return "its replay made other shapes than the kernels"
        if g.dtype.kind in "fc":
            scale = float(np.nanmax(np.abs(w))) if w.size and not np.isnan(w).all() else 0.0
            if not np.allclose(g, w, rtol=1e-4, atol=1e-5 * max(1.0, scale), equal_nan=True):
                return "its replay differed from the kernels' run on a check input"
        elif not np.array_equal(g, w):
            return "its replay differed from the kernels' run on a check input"
    if best[1] > best[0] * GAIN:
        return (
            f"its replay took {best[1] * 1e3:.3f} ms against the kernels' {best[0] * 1e3:.3f}"
            " (the better of two runs each)"
        )
    return ""


def _under(rec: Recorder, fn: Callable[[], list[Any]]) -> list[Any]:
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


def _forget(rec: Recorder) -> Callable[..., None]:
    """The dry pass's hook: each instruction's notes dropped as it ends (they hold its
    buffers, whose lifetimes the pass is timing)."""

    def hook(*_: Any) -> None:
        rec.steps, rec.sealed, rec.held = [], False, []
        rec.node += 1

    return hook


class _Hook:
    """Called by the dispatch loop after each instruction of a recorded run."""

    __slots__ = ("trace", "rec", "slots")

    def __init__(self, trace: Trace, rec: Recorder) -> None:
        self.trace, self.rec = trace, rec
        self.slots: list[Any] | None = None

    def __call__(self, ins: Instr, args: list[Any], out: Any, res: Any, slots: list) -> None:
        self.slots = slots
        trace, rec = self.trace, self.rec
        trace.total += 1
        results = [slots[s] if s >= 0 else None for s in ins.outs]
        trace.keep.append((args, out, results))
        several = type(res) is tuple or type(res) is list
        single = (  # the kernel's results are what the slots hold (no executor copy)
            all(r is s for r, s in zip(res, results)) and len(res) >= len(results)
            if several
            else type(res) is np.ndarray and len(results) == 1 and results[0] is res
        )
        if not rec.sealed and ins.alias and not rec.steps:  # a view kernel that made views
            rec.sealed = _views_of(results, args)
            single = True
        if rec.sealed and single:
            trace.sealed += 1
            trace.steps.extend(rec.steps)
        else:
            nested = ins.ctx is not None and len(ins.reads) > len([i for i in ins.ins if i >= 0])
            rerun = _Rerun(ins, args, out, results, list(slots) if nested else None)
            trace.steps.append((rerun, (), rec.capture()))
        rec.steps, rec.sealed = [], False
        rec.node += 1

    def final(self, program: Program) -> list[Any]:
        slots = self.slots or []
        return [slots[s] for s in program.output_slots] if slots else []


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _views_of(results: list[Any], args: list[Any]) -> bool:
    """Whether every result is one of ``args``' arrays or a view of one's memory (what a
    kernel registered ``alias=True`` returns when it copied nothing: no work to replay)."""
    roots = {id(_root(a)) for a in args if type(a) is np.ndarray}
    arrays = [r for r in results if r is not None]  # an output not asked for: None
    return bool(arrays) and all(type(r) is np.ndarray and id(_root(r)) in roots for r in arrays)


def _recordable(program: Program) -> bool:
    """Host arrays (a node with nested graphs re-runs on the frame it saw: ``_Rerun``)."""
    return bool(program.backend.host_memory)
