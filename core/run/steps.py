"""The step runner: a session's run as a flat list of steps over numbered slots.

A step is either a copy of one tensor between two devices or the run of one partition (its
``program`` takes the partition's input tensors and returns its outputs). ``build_steps``
numbers every (value, device) pair, orders the copies before the partition that reads them,
and frees each slot after its last reader with ``free_after_last_use``, the one last-use
routine the executor's ``Program`` shares.

Invariants:
    * Graph inputs and outputs live on the host; a constant graph output is a slot filled
      before the run.
    * A copy to or from a device that declares streams (``Backend.streams()``) runs on its
      copy stream (``core/run/streams.py``); a host array a copy to the host fills is read
      only after its copy was synchronized (before its first reader, and before returning).
    * A slot is freed (device tensors released through their backend) right after the step
      that reads it last; a failed run releases every device tensor it still holds, and a raw
      ``MemoryError`` reaches the caller as ``OutOfMemoryError`` naming the step's device.
    * A request whose run options are terminated stops before its next step
      (``core/run/cancel.py``), released as a failed run, with no device blamed.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any

import numpy as np

from anychip.core.plan.partition import HOST, CopyRecord, Partition
from anychip.core.run import cancel
from anychip.core.run.slots import free_after_last_use, release_quietly
from anychip.core.run.streams import stream_copier
from anychip.errors import AnychipError, OutOfMemoryError, PlacementError, RunTerminatedError
from anychip.ir.graph import Graph
from anychip.ir.value import Value

__all__ = ["Step", "StepProgram", "build_steps", "mark_waits"]


class Step:
    """One copy or one partition run: ``fn`` maps input tensors to outputs."""

    __slots__ = (
        "is_copy",
        "fn",
        "ins",
        "outs",
        "frees",
        "device",
        "label",
        "runs",
        "moved",
        "last",
        "pending",
        "waits",
    )

    def __init__(
        self, is_copy: bool, fn: Any, ins: list[int], outs: list[int], label: str, device: str
    ) -> None:
        self.is_copy = is_copy
        self.fn = fn
        self.ins = ins
        self.outs = outs
        self.frees: tuple[tuple[int, Any], ...] = ()
        #: The device whose memory the step's outputs take (a copy's destination).
        self.device = device
        self.label = label
        #: Copies only: runs made, bytes moved in all of them, and in the last one.
        self.runs = self.moved = self.last = 0
        #: A copy to the host on a device's copy stream: ``fn`` returns ``(array, sync)``.
        self.pending = False
        #: Slots this step reads that a pending copy fills: synchronized before it runs.
        self.waits: tuple[int, ...] = ()


class StepProgram:
    """The steps of a compiled model and the slots they run over."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.nslots = 0
        self.feed_slots: list[int] = []
        self.output_slots: list[int] = []
        self.consts: list[tuple[int, Any]] = []
        #: Slots holding device tensors, with their release: given back when a run fails.
        self.device_slots: list[tuple[int, Any]] = []
        #: The transfer budget of one run in bytes (``load(max_copy_bytes=...)``), or None.
        self.max_copy_bytes: int | None = None
        #: ``(step, feed order, output order)`` when the run is one host partition reading
        #: feeds only and giving every output (one-device sessions): no slots to fill. An
        #: order is None where it is the identity (nothing to pick).
        self.direct: tuple[Step, list[int] | None, list[int] | None] | None = None

    @property
    def copy_steps(self) -> list[Step]:
        return [s for s in self.steps if s.is_copy]

    def run(self, feeds: Sequence[Any], times: list[float] | None = None) -> list[Any]:
        """Run every step on the host arrays ``feeds`` (graph input order); all outputs.
        ``times``, when given, receives each step's seconds (the session's feedback runs)."""
        step: Step | None
        if self.direct is not None and times is None:
            step, order, picks = self.direct
            try:
                outs = step.fn(list(feeds) if order is None else [feeds[i] for i in order])
            except BaseException as e:
                self._failed(e, step, None)
            return outs if picks is None else [outs[j] for j in picks]
        slots: list[Any] = [None] * self.nslots
        for s, arr in zip(self.feed_slots, feeds):
            slots[s] = arr
        for s, c in self.consts:
            slots[s] = c
        step = None
        budget = self.max_copy_bytes
        moved = 0
        pending: dict[int, Any] = {}  # slot -> synchronize of the copy filling it
        watched = cancel.current()  # RunOptions.terminate, asked between steps
        try:
            for step in self.steps:
                if watched is not None:
                    cancel.stop_if_terminated(watched, step.label)
                t0 = perf_counter() if times is not None else 0.0
                if step.waits:
                    _synchronize(pending, step.waits)
                if step.is_copy:
                    src = slots[step.ins[0]]
                    out = step.fn(src)
                    if step.pending:
                        out, sync = out
                        if times is None:
                            pending[step.outs[0]] = sync
                        else:
                            sync()  # timed runs: the copy's time is its own step's
                    slots[step.outs[0]] = out
                    nbytes = _nbytes(src if type(src) is np.ndarray else out)
                    step.runs += 1
                    step.moved += nbytes
                    step.last = nbytes
                    moved += nbytes
                    if budget is not None and moved > budget:
                        self._over_budget(moved)
                else:
                    for s, r in zip(step.outs, step.fn([slots[i] for i in step.ins])):
                        slots[s] = r
                if times is not None:
                    times.append(perf_counter() - t0)
                for s, release in step.frees:
                    if release is not None and slots[s] is not None:
                        release(slots[s])
                    slots[s] = None
            if pending:
                _synchronize(pending, list(pending))
        except BaseException as e:
            _synchronize_quietly(pending)
            self._failed(e, step, slots)
        return [slots[s] for s in self.output_slots]

    def _failed(self, e: BaseException, step: Step | None, slots: list[Any] | None) -> None:
        """Re-raise a run's error: device tensors given back, the failing step's device named
        on it (failover), a raw ``MemoryError`` as ``OutOfMemoryError``."""
        if slots is not None:
            self._release(slots)
        if step is not None and not hasattr(e, "anychip_device") and not _cancelled(e):
            _blame(e, step)
        if isinstance(e, MemoryError) and not isinstance(e, AnychipError):
            raise OutOfMemoryError(
                f"out of memory while running {step.label if step else 'the model'}: "
                f"{type(e).__name__}: {e}. "
                "Run with a smaller input, or place part of the model on another device.",
                device=step.device if step else "",
            ) from e
        raise e

    def _over_budget(self, moved: int) -> None:
        edges = ", ".join(f"{st.label[5:]} ({st.last} B)" for st in self.steps if st.is_copy)
        raise PlacementError(
            f"this run copied {moved} bytes between devices, more than "
            f"max_copy_bytes={self.max_copy_bytes}: {edges}. Pin nodes to fewer devices, use "
            "smaller inputs, or raise max_copy_bytes."
        )

    def _release(self, slots: list[Any]) -> None:
        """Give back the device tensors a failed run still holds."""
        for s, release in self.device_slots:
            t = slots[s]
            if t is not None:
                slots[s] = None
                release_quietly(release, [t])


def build_steps(
    graph: Graph,
    partitions: list[Partition],
    copies: list[CopyRecord],
    backends: list[Any],
    registry: Any,
) -> StepProgram:
    """The steps running ``partitions`` in order, each preceded by the copies it needs."""
    by_name = {b.name: b for b in backends}
    by_name.setdefault(HOST, registry.backends[HOST])
    slot: dict[tuple[Value, str], int] = {}

    def get(v: Value, dev: str) -> int:
        return slot.setdefault((v, dev), len(slot))

    prog = StepProgram()
    prog.feed_slots = [get(v, HOST) for v in graph.inputs]
    values = {v.name: v for v in graph.values()}
    copies_before: dict[int, list[CopyRecord]] = {}
    for c in copies:
        copies_before.setdefault(c.before, []).append(c)
    for index in range(len(partitions) + 1):
        for c in copies_before.get(index, []):
            v = values[c.tensor]
            fn, pending = _copier(by_name[c.src], by_name[c.dst])
            label = f"copy {c.tensor} {c.src}->{c.dst}"
            prog.steps.append(Step(True, fn, [get(v, c.src)], [get(v, c.dst)], label, c.dst))
            prog.steps[-1].pending = pending
        if index < len(partitions):
            p = partitions[index]
            ins = [get(v, p.device) for v in p.inputs]
            outs = [get(v, p.device) for v in p.outputs]
            label = f"partition {p.index} on {p.device}"
            prog.steps.append(Step(False, p.program, ins, outs, label, p.device))
    for v in graph.outputs:
        if (v, HOST) not in slot and v.const is not None:
            prog.consts.append((get(v, HOST), v.const))
        prog.output_slots.append(get(v, HOST))
    device_of = {s: dev for (_, dev), s in slot.items()}
    release_of = {
        s: None if by_name[d].host_memory else by_name[d].release for s, d in device_of.items()
    }
    prog.device_slots = [(s, r) for s, r in release_of.items() if r is not None]
    keep = set(prog.output_slots) | {s for s, _ in prog.consts}
    frees = free_after_last_use([st.ins + st.outs for st in prog.steps], keep)
    for st, fr in zip(prog.steps, frees):
        st.frees = tuple((s, release_of[s]) for s in fr)
    mark_waits(prog.steps)
    prog.nslots = len(slot)
    prog.direct = _direct(prog)
    return prog


def mark_waits(steps: list[Step]) -> None:
    """Set each step's ``waits``: the slots it reads that a pending copy fills."""
    filled_later = {st.outs[0] for st in steps if st.pending}
    for st in steps:
        st.waits = tuple(s for s in st.ins if s in filled_later)


def _direct(prog: StepProgram) -> tuple[Step, list[int] | None, list[int] | None] | None:
    """``StepProgram.direct`` for ``prog``, or None (copies, several partitions, constant or
    fed-through outputs, device tensors)."""
    if len(prog.steps) != 1 or prog.steps[0].is_copy or prog.consts or prog.device_slots:
        return None
    step = prog.steps[0]
    fed = {s: i for i, s in enumerate(prog.feed_slots)}
    made = {s: j for j, s in enumerate(step.outs)}
    if any(s not in fed for s in step.ins) or any(s not in made for s in prog.output_slots):
        return None
    order = [fed[s] for s in step.ins]
    picks = [made[s] for s in prog.output_slots]
    return (
        step,
        None if order == list(range(len(prog.feed_slots))) else order,
        None if picks == list(range(len(step.outs))) else picks,
    )


def _cancelled(e: BaseException) -> bool:
    """A request its run options terminated: no device is at fault (no failover)."""
    return isinstance(e, RunTerminatedError)


def _blame(e: BaseException, step: Step) -> None:
    """Name on ``e`` the device whose step failed (a copy's device side), for failover."""
    device = step.device
    if step.is_copy and device == HOST:
        device = step.label.rsplit(" ", 1)[1].split("->")[0]
    try:
        e.anychip_device = device  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass  # an exception type without a __dict__: no failover information


def _nbytes(t: Any) -> int:
    """Bytes of a tensor: numpy's ``nbytes``, a device tensor's ``nbytes`` if it has one."""
    n = getattr(t, "nbytes", None)
    if callable(n):
        n = n()
    return int(n) if n is not None else 0


def _copier(src: Any, dst: Any) -> tuple[Any, bool]:
    """The step function of a copy from ``src`` to ``dst``, and whether it is pending."""
    on_stream = stream_copier(src, dst)
    if on_stream is not None:
        return on_stream
    if src.host_memory:
        return dst.to_device, False
    if dst.host_memory:
        return src.to_host, False
    return (lambda t: dst.from_device(t, src)), False


def _synchronize(pending: dict[int, Any], slots: Any) -> None:
    """Wait for the pending copies filling ``slots`` (each once)."""
    for s in slots:
        sync = pending.pop(s, None)
        if sync is not None:
            sync()


def _synchronize_quietly(pending: dict[int, Any]) -> None:
    """Wait for every pending copy of a failed run, ignoring their errors (the run's own
    error is the one to report)."""
    for sync in pending.values():
        try:
            sync()
        except Exception:  # the run's error is raised instead
            pass
    pending.clear()
