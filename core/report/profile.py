"""``Session.profile()``: per-node and per-copy times of real runs, as data, a Perfetto trace
and an HTML timeline.

The profiler runs the session's current steps (``core/run/steps.py``) with each step's function
and, in kernel-mode partitions, each node's kernel wrapped by a timer; the wrappers are put
back when it ends. A graph-mode partition (NPU style) runs as one executable, so it is timed
as a whole; its nodes are listed without times of their own.

Invariants: nothing is changed after ``profile()`` returns; events of one run never overlap
on one device lane except a node inside its partition's span; times come from
``time.perf_counter`` relative to the first run's start.

Example::

    prof = sess.profile(feeds, runs=3)          # doctest: +SKIP
    print(prof)                                 # the slowest nodes, time per device
    prof.save_trace("run.json")                 # ui.perfetto.dev or chrome://tracing
    prof.save_html("run.html")                  # a self-contained timeline
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from anychip.core.report.render import Rendered, render
from anychip.core.run.lifecycle import check_open
from anychip.core.run.steps import _nbytes

__all__ = ["Event", "Profile", "profile_session"]


@dataclass(slots=True)
class Event:
    """One timed span: ``kind`` is ``node``, ``partition`` or ``copy``; seconds from the
    profile's start; ``bytes`` for copies."""

    kind: str
    name: str
    device: str
    start: float
    seconds: float
    run: int
    op: str = ""
    partition: int = -1
    bytes: int = 0


@dataclass(slots=True)
class Profile(Rendered):
    """The events of ``runs`` runs (see the module docstring). Prints as text (``text()``);
    Jupyter and rich show tables, ``save_html`` a timeline (drawn in ``viz/``, through
    ``core/report/render.py``)."""

    report_kind = "profile"

    events: list[Event]
    runs: int
    devices: list[str]
    title: str = ""
    run_seconds: list[float] = field(default_factory=list)

    def by_kind(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def node_times(self) -> list[tuple[str, str, str, float]]:
        """``(node, op, device, mean seconds per run)``, slowest first."""
        total: dict[tuple[str, str, str], float] = {}
        for e in self.by_kind("node"):
            key = (e.name, e.op, e.device)
            total[key] = total.get(key, 0.0) + e.seconds
        rows = [(n, op, d, t / self.runs) for (n, op, d), t in total.items()]
        return sorted(rows, key=lambda r: -r[3])

    def device_times(self) -> dict[str, float]:
        """Seconds per run in each device's partitions, and ``copies`` for the copies."""
        out: dict[str, float] = {}
        for e in self.events:
            if e.kind in ("partition", "copy"):
                key = "copies" if e.kind == "copy" else e.device
                out[key] = out.get(key, 0.0) + e.seconds / self.runs
        return out

    def to_trace(self) -> dict[str, Any]:
        """The Chrome trace event format (Perfetto opens it): one track per device and one
        for the copies; microseconds."""
        lanes = list(self.devices) + ["copies"]
        events: list[dict[str, Any]] = [
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": i, "args": {"name": lane}}
            for i, lane in enumerate(lanes)
        ]
        for e in self.events:
            lane = "copies" if e.kind == "copy" else e.device
            tid = lanes.index(lane) if lane in lanes else len(lanes)
            args: dict[str, Any] = {"run": e.run, "device": e.device}
            if e.op:
                args["op"] = e.op
            if e.kind == "copy":
                args["bytes"] = e.bytes
            events.append(
                {
                    "name": e.name,
                    "cat": e.kind,
                    "ph": "X",
                    "pid": 1,
                    "tid": tid,
                    "ts": round(e.start * 1e6, 3),
                    "dur": round(e.seconds * 1e6, 3),
                    "args": args,
                }
            )
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def save_trace(self, path: str | Path) -> Path:
        """Write ``to_trace()`` as JSON (open it at ui.perfetto.dev or chrome://tracing)."""
        path = Path(path)
        path.write_text(json.dumps(self.to_trace()), encoding="utf-8")
        return path

    def save_html(self, path: str | Path) -> Path:
        """Write the timeline as one self-contained HTML page (``viz/timeline.py``)."""
        page = render("profile", "timeline", self)
        path = Path(path)
        path.write_text(page, encoding="utf-8")
        return path

    def text(self, top: int = 15) -> str:
        """The profile as plain text: runs, time per device, the ``top`` slowest nodes, and
        the graph-mode partitions (timed whole)."""
        lines = [
            f"profile of {self.runs} run(s) on {', '.join(self.devices)}: "
            + ", ".join(f"{t * 1e3:.3f}" for t in self.run_seconds)
            + " ms",
            "per run: "
            + ", ".join(f"{d} {t * 1e3:.3f} ms" for d, t in self.device_times().items()),
        ]
        rows = self.node_times()[:top]
        if rows:
            w = max(len(r[0]) for r in rows)
            lines.append(f"{'node':<{w}}  {'op':<18} {'device':<7} {'ms/run':>9}")
            lines.extend(f"{n:<{w}}  {op:<18} {d:<7} {t * 1e3:>9.3f}" for n, op, d, t in rows)
        timed = {e.partition for e in self.by_kind("node")}
        whole: dict[str, float] = {}
        for e in self.by_kind("partition"):
            if e.partition not in timed:
                whole[e.name] = whole.get(e.name, 0.0) + e.seconds / self.runs
        lines.extend(
            f"{name}: {t * 1e3:.3f} ms/run (one compiled executable: no per-node times)"
            for name, t in whole.items()
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<Profile {self.runs} run(s), {len(self.events)} events>"


def profile_session(session: Any, feeds: Mapping[str, Any], runs: int = 1) -> Profile:
    """Run ``session`` ``runs`` times on ``feeds`` with its steps and kernels timed."""
    check_open(session)
    if runs < 1:
        from anychip.errors import AnychipError

        raise AnychipError(f"profile(runs={runs}): give at least one run")
    session.run(None, feeds)  # warm-up: compiles, plans, and the feedback's first runs
    for sp in session.compiled.specialized.values():
        sp.wait(300)  # a background compile for these shapes: time the device, not the host
    arrays = session._feeds.check(feeds)
    events: list[Event] = []
    run_seconds: list[float] = []
    with session._lock:
        compiled = session.compiled
        t0 = perf_counter()
        state = {"run": 0, "t0": t0}
        with _timed(compiled, events, state):
            for r in range(runs):
                state["run"] = r
                start = perf_counter()
                compiled.steps.run(arrays)
                run_seconds.append(perf_counter() - start)
    title = f"{getattr(session.model, 'path', None) or session.model.graph.name or 'model'}"
    return Profile(events, runs, list(session.devices), title, run_seconds)


@contextmanager
def _timed(compiled: Any, events: list[Event], state: dict) -> Iterator[None]:
    """Wrap every step's and every top-level kernel's function with a timer; restore them."""
    saved: list[tuple[Any, Any]] = []
    part_of = {f"partition {p.index} on {p.device}": p for p in compiled.partitions}
    try:
        for step in compiled.steps.steps:
            saved.append((step, step.fn))
            if step.is_copy:
                name, edge = step.label[5:].rsplit(" ", 1)
                src = edge.split("->")[0]
                step.fn = _copy_timer(step.fn, events, state, name, src, step.device)
            else:
                p = part_of[step.label]
                step.fn = _span_timer(
                    step.fn, events, state, "partition", step.label, p.device, partition=p.index
                )
        for p in compiled.partitions:
            pm = compiled.part_memory.get(p.index)
            if pm is None:
                continue
            pm.suspended += 1  # each node timed through its kernel: no interceptor (replay)
            saved.append((pm, None))
            for ins in pm.program.instrs:
                saved.append((ins, ins.fn))
                n = ins.node
                ins.fn = _span_timer(
                    ins.fn, events, state, "node", n.name, p.device, op=n.op_type, partition=p.index
                )
        yield
    finally:
        for obj, fn in saved:
            if fn is None:
                obj.suspended -= 1
            else:
                obj.fn = fn


def _span_timer(
    fn: Any,
    events: list[Event],
    state: dict,
    kind: str,
    name: str,
    device: str,
    op: str = "",
    partition: int = -1,
) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            end = perf_counter()
            events.append(
                Event(
                    kind,
                    name,
                    device,
                    start - state["t0"],
                    end - start,
                    state["run"],
                    op,
                    partition,
                )
            )

    return timed


def _copy_timer(fn: Any, events: list[Event], state: dict, tensor: str, src: str, dst: str) -> Any:
    def timed(t: Any) -> Any:
        start = perf_counter()
        out = fn(t)
        end = perf_counter()
        nbytes = _nbytes(t if type(t) is np.ndarray else out)  # the host side's size
        events.append(
            Event(
                "copy",
                f"{tensor} {src}->{dst}",
                dst,
                start - state["t0"],
                end - start,
                state["run"],
                bytes=nbytes,
            )
        )
        return out

    return timed
