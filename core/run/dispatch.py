"""The per-node dispatch loop of an executor ``Program``: one flat pass over its instructions.

Everything a node needs is resolved when the program is compiled (``Instr.seal``): the
kernel, the slots of its arguments (an omitted optional input reads a slot that is always
None, so building the arguments is one list comprehension), its attributes as a ready keyword
dict, the one output slot of a single-output node, the dtype and shape inference declared for
it, and the slots to free after it. The loop does no dictionary lookups, attribute parsing or
allocations of its own; a node whose results take the common shape (one numpy array for one
output slot) is stored inline, anything else (several outputs, numpy scalars, a declared dtype
or shape that does not match at first sight) goes through ``_Run.store``, which keeps the full
checks. The kernel is read from ``Instr.fn`` on every call, so the profiler's timers and a
test's replacement kernel are seen without recompiling.

The bookkeeping is the executor's, unchanged: planned ``out`` views and declined ones, copies
of results that view the arena behind the plan's back, bytes held per slot (``peak``), shapes
recorded for a new plan, the backend's ``release`` of device tensors after their last reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.run import cancel
from anychip.core.run.checks import check_result, kernel_name, mismatch
from anychip.core.run.slots import release_quietly
from anychip.errors import KernelError

if TYPE_CHECKING:
    from anychip.core.run.kernel_call import Arena, Instr
    from anychip.core.run.program import Program

__all__ = ["run_instrs", "Run"]

_ndarray = np.ndarray


def run_instrs(program: Program, slots: list[Any], run: Run) -> None:
    """Run ``program``'s instructions over ``slots`` (filled with its inputs and constants)."""
    views, base, aliases, record = run.views, run.base, run.aliases, run.record
    track, held, hook = run.track, run.held, run.hook
    live, peak, declined = run.live, run.peak, 0
    release = program._release
    host = release is None  # device tensors are host arrays: an ndarray result is one
    call_failed = program.on_error
    watched = cancel.current()  # RunOptions.terminate, asked before each node when given
    for ins in program.instrs:
        if watched is not None:
            cancel.stop_if_terminated(watched, f"node {ins.node.name!r}")
        args = [slots[i] for i in ins.args]
        ctx = ins.ctx
        if ctx is not None:
            ctx._frame = slots
            args.insert(0, ctx)
        out = views[ins.out0] if views is not None and ins.takes_out else None
        try:
            if out is None:
                res = ins.fn(*args, **ins.attrs)
            else:
                res = ins.fn(*args, out=out, **ins.attrs)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            call_failed(ins, args, e)
        s = ins.out0
        want = ins.want
        if (
            s >= 0
            and type(res) is _ndarray
            and host
            and (
                want is None
                or (res.dtype is want[0] or res.dtype == want[0])
                and (
                    res.shape == want[1]
                    if want[1] is not None
                    else want[2] is None or res.ndim == want[2]
                )
            )
        ):
            # One array for one output slot, as declared: the common case, stored inline.
            if out is not None and res is not out:
                declined += 1
            if base is not None and res is not out and res.base is base and s not in aliases:
                res = res.copy()  # views planned memory the plan did not expect
            slots[s] = res
            if track:
                nb = res.nbytes if res.base is None else 0
                held[s] = nb
                live += nb
                if live > peak:
                    peak = live
            if record is not None:
                record[s] = (res.shape, res.dtype)
        else:
            results = res if type(res) is tuple or type(res) is list else (res,)
            if out is not None and (not results or results[0] is not out):
                declined += 1
            run.live, run.peak = live, peak
            run.store(ins, results, slots)
            live, peak = run.live, run.peak
        if hook is not None:  # a recorded run (backends/cpu/replay/record.py)
            hook(ins, args, out, res, slots)
        for f in ins.frees:
            if release is not None and slots[f] is not None:
                try:  # free when nothing raises: no call added to the per-node loop
                    release(slots[f])
                except BaseException as e:
                    slots[f] = None  # not released twice by _drop
                    program._release_failed(ins, e)
            slots[f] = None
            if track:
                live -= held[f]
                held[f] = 0
    run.live, run.peak = live, peak
    program.declined += declined


class Run:
    """The bookkeeping of one ``Program.run``: the arena's views, and (top-level programs)
    the bytes held per slot, live and at peak."""

    __slots__ = (
        "views",
        "base",
        "aliases",
        "track",
        "held",
        "live",
        "peak",
        "record",
        "device",
        "host",
        "release",
        "hook",
    )

    def __init__(
        self, program: Program, arena: Arena | None, record: dict | None, hook: Any = None
    ) -> None:
        self.hook = hook
        self.views = self.base = None
        self.live = self.peak = 0
        if arena is not None:
            self.views, self.base, self.live = arena.views, arena.base, arena.nbytes
        self.aliases = program.alias_slots
        self.track = program.track
        self.held = [0] * program.nslots if self.track else []
        self.record = record
        self.device = program.backend.name
        self.host = program.backend.host_memory
        self.release = program.backend.release

    def store(self, ins: Instr, results: Sequence[Any], slots: list[Any]) -> None:
        """Put an instruction's results in their slots (checked against ``ins.expect``)."""
        base, views, expect = self.base, self.views, ins.expect
        for i, (s, r) in enumerate(zip(ins.outs, results)):
            if s < 0:
                continue
            if not self.host and isinstance(r, (np.ndarray, np.generic)):
                self._host_array(ins, i, r, results)
            if isinstance(r, np.generic):
                r = np.asarray(r)
            if expect is not None:
                want = expect[i]
                if want is not None and (
                    (r.dtype is not want[0] or r.shape != want[2])
                    if type(r) is np.ndarray and want[2] is not None
                    else mismatch(r, want)
                ):
                    self._reject(ins, i, r, want, results)
            if (
                base is not None
                and views is not None
                and type(r) is np.ndarray
                and r is not views[s]
                and r.base is base
                and s not in self.aliases
            ):
                # A view of planned memory the plan did not expect: its bytes may be reused
                # while it lives, so it gets its own.
                r = r.copy()
            slots[s] = r
            if self.track:
                nb = _owned_bytes(r)
                self.held[s] = nb
                self.live += nb
            if self.record is not None and type(r) is np.ndarray:
                self.record[s] = (r.shape, r.dtype)
        if self.live > self.peak:
            self.peak = self.live
        if not self.host:
            self._release_unused(ins, results, slots)

    def _release_unused(self, ins: Instr, results: Sequence[Any], slots: list[Any]) -> None:
        """Release the device tensors a kernel returned for outputs the node omits (a
        LayerNormalization used for Y alone still computes Mean and InvStdDev): nothing else
        will, and the device would keep them for good."""
        dropped = [r for s, r in zip(ins.outs, results) if s < 0]
        dropped += list(results[len(ins.outs) :])
        dropped = [r for r in dropped if r is not None and not isinstance(r, (list, tuple))]
        if dropped:
            dropped = [r for r in dropped if not any(r is t for t in slots)]
            release_quietly(self.release, dropped)

    def _host_array(self, ins: Instr, i: int, r: Any, results: Sequence[Any]) -> None:
        """A device kernel returned a host numpy array: the next node would get a host array
        for a device tensor and fail, blamed. Raise here, naming this node and its kernel."""
        release_quietly(self.release, [t for t in results[i + 1 :] if t is not None])
        out = ins.node.outputs[i] if i < len(ins.node.outputs) else None
        raise KernelError(
            f"{self.device}: kernel {kernel_name(ins)} returned a host numpy array "
            f"{np.asarray(r).dtype}{list(np.shape(r))} for output {i} "
            f"({out.name if out is not None else '?'!r}) of node {ins.node.name!r} "
            f"({ins.node.qualified_op}); a {self.device} kernel returns {self.device} tensors "
            "(what the backend's to_device makes): compute on the device, or copy the result "
            "in with to_device"
        )

    def _reject(self, ins: Instr, i: int, r: Any, want: Any, results: Sequence[Any]) -> None:
        """Raise the kernel's mismatch; the results not yet in a slot (this one and those
        after it) are released first, since nothing else holds them."""
        try:
            check_result(self.device, ins.node, kernel_name(ins), i, r, want)
        except Exception:
            if not self.host:
                release_quietly(self.release, [t for t in results[i:] if t is not None])
            raise


def _owned_bytes(t: Any) -> int:
    """Bytes ``t`` holds of its own: a numpy view or a device view holds none."""
    if type(t) is np.ndarray:
        return t.nbytes if t.base is None else 0
    if getattr(t, "is_view", False):
        return 0
    nb = getattr(t, "nbytes", 0)
    return nb if type(nb) is int else 0
