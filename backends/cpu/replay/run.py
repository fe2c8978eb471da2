"""The replay of recorded kernel calls (``backends/cpu/replay/record.py`` says how a run is
recorded, and
what a replay does and does not do): ``Replay``, one per kernel-mode partition whose backend
runs it (``CpuBackend.runner``), decides per run whether to replay, record or run the kernels; a
``Trace`` is one recorded run."""

from __future__ import annotations

import gc
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.cpu.replay.record import Recorder, under
from anychip.core.memory import hugepages
from anychip.core.run import cancel
from anychip.errors import RunTerminatedError

if TYPE_CHECKING:
    from anychip.core.run.kernel_call import Instr
    from anychip.core.run.program import Program

__all__ = [
    "Replay", "Trace", "RECORD_AT", "STEPS", "REPLAY_FROM", "SLOW_NODE", "GAIN", "RETRY",
    "MAX_WAIT", "MAX_BYTES",
]  # fmt: skip

#: Runs with the same input shapes and threads before the next is recorded (a kernel
#: remembers its fast path on its first run; ``thread_choice`` warms both thread counts).
RECORD_AT = 3
#: Requests a recording takes, one step each (``_Recording``): two dry runs, the recorded
#: run, the check's two halves. Each request runs its own inputs once and at most one run of
#: the check besides, so no request costs more than two runs (all seven in one request made
#: that run 7-20x the steady time: SqueezeNet 122 ms against 13 at run 3, a fresh process).
STEPS = 5
#: The first run of a signature that replays (when its recording was kept).
REPLAY_FROM = RECORD_AT + STEPS
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

    def play(
        self,
        feeds: Sequence[Any],
        state: Any,
        apply: Callable[[Any, Any], None],
        fresh: Callable[[int, np.ndarray], np.ndarray],
    ) -> list:
        for own, t in zip(self.inputs, feeds):
            np.copyto(own, t)
        cur = entry = state
        watched = cancel.current()  # RunOptions.terminate, asked before each call when given
        try:
            for fn, args, st in self.steps:
                if watched is not None:
                    cancel.stop_if_terminated(watched, "a replayed call")
                if st != cur and st is not None:
                    apply(st, cur)
                    cur = st
                fn(*args)
        finally:
            if cur != entry:
                apply(entry, cur)
        return [fresh(i, o) for i, o in enumerate(self.outputs)]


def _copy(i: int, a: np.ndarray) -> np.ndarray:
    return a.copy()


def _bytes(values: Sequence[Any]) -> int:
    """Bytes of the distinct arrays behind ``values`` (lists, tuples and dicts opened: the
    recorded arguments, results and buffers)."""
    seen: dict[int, int] = {}
    stack = list(values)
    while stack:
        v = stack.pop()
        if type(v) is np.ndarray:
            base = v
            while isinstance(base.base, np.ndarray):
                base = base.base
            seen[id(base)] = base.nbytes
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return sum(seen.values())


class Replay:
    """A partition's traces (``backends/cpu/replay/record.py``'s docstring): ``run`` replays,
    records, or
    runs the kernels (``usual``), and returns the outputs."""

    def __init__(
        self,
        program: Program,
        capture: Callable[[], Any],
        apply: Callable[[Any, Any], None],
        arena_for: Callable[[Sequence[Any]], tuple[Callable[[np.ndarray], Any] | None, int]],
        fresh: Callable[[int, np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.program = program
        #: Output ``i``'s array for a replay's result (``recycle.Outputs.copy``), else a copy.
        self.fresh = fresh or _copy
        self.capture, self.apply = capture, apply
        #: The planned arena's views and size for a run's inputs (``PartitionMemory``).
        self.arena_for = arena_for
        self.traces: dict[tuple, Trace] = {}
        #: Recordings under way, one step per request (``_Recording``).
        self.recording: dict[tuple, _Recording] = {}
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
        key = (state, *[(t.shape, t.dtype) if type(t) is np.ndarray else None for t in inputs])
        trace = self.traces.get(key) or self.recording.get(key)
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
                self.recording[key] = _Recording(self, inputs)
                return self._step(key, inputs, state, usual)
            finally:
                self.lock.release()
        if type(trace) is _Recording:
            if not self.lock.acquire(blocking=False):
                return usual(inputs)
            try:
                return self._step(key, inputs, state, usual)
            finally:
                self.lock.release()
        if not self.lock.acquire(blocking=False):
            return usual(inputs)  # another thread replays: this one takes the kernels' path
        try:
            return trace.play(inputs, state, self.apply, self.fresh)
        except RunTerminatedError:
            raise  # the request was cancelled: the trace stays
        except _Stale as e:
            self._drop(key, f"dropped: {e}")
        except Exception as e:
            self._drop(key, f"dropped: a replayed call raised {type(e).__name__}: {e}"[:300])
        finally:
            self.lock.release()
        return usual(inputs)

    def _drop(self, key: tuple, why: str, again: bool = False) -> None:
        """No trace for ``key``; where ``again`` (a replay measured slower, or passes that
        took other paths: both can be the machine's load) recorded again later, after
        ``RETRY`` runs doubling with each try up to ``MAX_WAIT``."""
        self.traces.pop(key, None)
        self.recording.pop(key, None)
        tries = self.tries[key] = self.tries.get(key, 0) + 1
        wait = min(MAX_WAIT, RETRY << (tries - 1))
        self.seen[key] = RECORD_AT - wait if again else RECORD_AT + 1
        self.info["replay"] = why + (f" (recorded again in {wait} runs)" if again else "")

    def _step(
        self,
        key: tuple,
        inputs: Sequence[Any],
        state: Any,
        usual: Callable[[Sequence[Any]], list[Any]],
    ) -> list[Any]:
        """One step of ``key``'s recording on this request; the kept trace at its end."""
        rec = self.recording[key]
        collecting = gc.isenabled()  # a collection of the trace's young objects: later
        if collecting:
            gc.disable()
        try:
            outs, why = rec.step(inputs, state, usual)
        except RunTerminatedError:
            self.recording.pop(key, None)
            self.seen[key] = RECORD_AT - 1  # cancelled: the next run records instead
            raise
        except Exception as e:  # the kernels' own error: the usual path says it again
            self._drop(key, f"not recorded: a run raised {type(e).__name__}")
            raise
        finally:
            if collecting:
                gc.enable()
        if why is not None:
            if why.startswith("off: "):
                self.off = True  # so for every signature: the partition runs as before
                self._drop(key, why[5:])
            else:
                again = why.startswith(("not recorded: ", "not kept: its replay took"))
                again = again and not why.startswith("not recorded: outputs")
                self._drop(key, why, again=again)
            return outs
        if rec.done:
            del self.recording[key]
            trace = rec.trace
            if len(self.traces) >= MAX_TRACES:
                self.traces.pop(next(iter(self.traces)))
            self.traces[key] = trace
            self.info["replay"] = (
                f"{trace.sealed} of {trace.total} nodes replayed as {len(trace.steps)} "
                f"recorded calls (the others through their kernels); holds "
                f"{trace.nbytes >> 10} KiB"
            )
        return outs


class _Recording:
    """A recording under way, one step per request (``STEPS``), each request answered by a
    run on its own inputs:

    0, 1. the *dry* runs on private copies of the request's inputs and a private arena (the
       first may leave kernels on other remembered paths than the last usual run,
       ``decide``; the second times the buffers the kernels ask for), their outputs copied
       out as the answer;
    2. the *recorded* run, its buffers placed by ``Recorder.plan``: the answer;
    3. the check's first half: the answer by the kernels' path, then the kernels on the check
       input (the recorded inputs reversed: the same values elsewhere, so a buffer no call
       writes again, or bytes shared while still read, show);
    4. the second half: the trace replayed on the check input, which must give the kernels'
       answer on it, then (checked) replayed on the request's inputs for the answer; kept
       when the better of these two replays took under ``GAIN`` of the kernels' best (the
       usual runs before the recording, and step 3's two runs)."""

    __slots__ = ("replay", "n", "views", "raw", "arena", "dry", "trace", "want", "kernels",
                 "done")  # fmt: skip

    def __init__(self, replay: Replay, inputs: Sequence[Any]) -> None:
        self.replay = replay
        self.n = 0
        self.views, nbytes = replay.arena_for(inputs)
        self.raw = hugepages.empty(nbytes) if self.views is not None else None
        self.arena = self.views(self.raw) if self.views is not None else None
        self.dry: Recorder | None = None
        self.trace = Trace()
        self.want: list[Any] = []
        self.kernels = replay.fastest
        self.done = False

    def step(
        self, inputs: Sequence[Any], state: Any, usual: Callable[[Sequence[Any]], list[Any]]
    ) -> tuple[list[Any], str | None]:
        """This request's answer, and why the recording ends unkept (None: going on)."""
        n, self.n = self.n, self.n + 1
        program = self.replay.program
        if n < 2:  # a copy per pass: kernels may write over a partition's inputs (in place)
            self.dry = dry = Recorder(self.replay.capture)
            feeds = [np.array(t, copy=True, order="C") for t in inputs]
            outs = under(dry, lambda: program.run(feeds, arena=self.arena, hook=_forget(dry)))
            return _copies(outs), None
        if n == 2:
            return self._record(inputs)
        trace, replay = self.trace, self.replay
        check = [np.flip(t).copy() for t in trace.inputs]  # before a replay overwrites them
        if n == 3:
            t0 = time.perf_counter()
            outs = usual(inputs)
            t1 = time.perf_counter()
            try:  # reversed token ids or masks are still in range; a model may refuse them
                self.want = program.run(check)
            except RunTerminatedError:
                raise
            except Exception as e:
                return outs, f"not kept: the kernels refused the check input ({type(e).__name__})"
            self.kernels = min(self.kernels, t1 - t0, time.perf_counter() - t1)
            return outs, None
        t0 = time.perf_counter()
        try:
            got = trace.play(check, state, replay.apply, _copy)
        except _Stale as e:
            return usual(inputs), f"not kept: {e}"
        t1 = time.perf_counter()
        why = _differs(got, self.want)
        if why:
            return usual(inputs), f"not kept: {why}"
        outs = trace.play(inputs, state, replay.apply, replay.fresh)  # checked: the answer
        played = min(t1 - t0, time.perf_counter() - t1)
        if played > self.kernels * GAIN:
            return outs, (
                f"not kept: its replay took {played * 1e3:.3f} ms against the kernels' "
                f"{self.kernels * 1e3:.3f} (the better of two runs each)"
            )
        self.done = True
        return outs, None

    def _record(self, inputs: Sequence[Any]) -> tuple[list[Any], str | None]:
        """The recorded run on private copies of the inputs, with the buffers the dry run
        timed placed by ``Recorder.plan``."""
        program, trace = self.replay.program, self.trace
        assert self.dry is not None
        offsets, size = self.dry.plan()
        self.dry = None
        rec = Recorder(self.replay.capture, hugepages.empty(size), offsets)
        trace.inputs = [np.array(t, copy=True, order="C") for t in inputs]
        hook = _Hook(trace, rec)
        outs = under(rec, lambda: program.run(trace.inputs, arena=self.arena, hook=hook))
        trace.outputs = [o for o in hook.final(program) if type(o) is np.ndarray]
        trace.keep += [self.raw, rec.block, rec.held]
        trace.nbytes = _bytes(trace.keep + trace.inputs + trace.outputs)
        if len(trace.outputs) != len(outs) or rec.broken:
            return _copies(outs), f"not recorded: {rec.broken or 'outputs that are not arrays'}"
        if trace.nbytes > MAX_BYTES or trace.sealed * 2 < trace.total:
            return [o.copy() for o in trace.outputs], (
                f"off: not kept: {trace.sealed} of {trace.total} nodes are recorded calls"
                if trace.nbytes <= MAX_BYTES
                else f"off: not kept: the trace would hold {trace.nbytes >> 20} MiB"
            )
        return [o.copy() for o in trace.outputs], None


def _copies(outs: Sequence[Any]) -> list[Any]:
    """A run's outputs copied out of a private arena (the next pass writes over it)."""
    return [o.copy() if type(o) is np.ndarray else o for o in outs]


def _differs(got: Sequence[Any], want: Sequence[Any]) -> str:
    """Why a replay's outputs on the check input are not the kernels' (``''``: they are)."""
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
    return ""


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
