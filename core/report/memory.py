"""``MemoryReport``: what ``Session.memory()`` returns, one ``DeviceMemory`` per device.

Figures per device (bytes):

* ``planned``: the liveness plan of the device's intermediate tensors (the largest over its
  partitions, which run one after the other; dynamic shapes: over the signatures planned);
* ``lower_bound``: the most bytes of intermediate tensors live at one step, which no plan can
  beat (``planned / lower_bound`` is the plan's quality);
* ``peak``: the most bytes in use during a run: the pool's peak where the device's memory
  goes through a pool that sees every tensor (NPU), otherwise the bytes of arrays the executor
  held (CPU, kernel-mode devices), planned arena included;
* ``reserved``: what the device's pool holds (live and cached blocks);
* ``arena``: the part of the plan kernels really write into (``out=``, the executor's out
  protocol), the largest over the device's partitions (an arena under
  ``partition.MIN_ARENA_BYTES`` is not used: 0); the rest of ``planned`` is allocated per
  node by kernels without ``out``. ``declined``: planned views a kernel was handed and did not
  use, summed over runs (0 when every out-capable kernel wrote its output in place);
* ``capacity``: the device's memory, None when unknown.

Plan cache counters (dynamic shapes): ``hits``, ``misses``, ``replans``; ``notes`` say why
work left a device (a partition that did not fit).

Example::

    >>> report = sess.memory()          # doctest: +SKIP
    >>> report["cpu"].planned <= 1.15 * report["cpu"].lower_bound   # doctest: +SKIP
    True
    >>> print(report)                   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from anychip.core.memory.stats import _human
from anychip.core.report.render import Rendered
from anychip.core.run.lifecycle import CLOSED
from anychip.errors import AnychipError

__all__ = ["DeviceMemory", "MemoryReport", "memory_report"]


@dataclass(slots=True)
class DeviceMemory:
    """The memory figures of one device in one session (see the module docstring)."""

    device: str
    planned: int = 0
    lower_bound: int = 0
    peak: int = 0
    reserved: int = 0
    arena: int = 0
    declined: int = 0
    capacity: int | None = None
    partitions: int = 0
    dynamic_partitions: int = 0
    hits: int = 0
    misses: int = 0
    replans: int = 0
    source: str = ""

    @property
    def ratio(self) -> float:
        """``planned / lower_bound`` (1.0 when nothing is planned)."""
        return self.planned / self.lower_bound if self.lower_bound else 1.0


@dataclass(slots=True)
class MemoryReport(Rendered):
    """Per-device records (``report["cpu"]``, ``for rec in report``) and notes; prints as a
    table (Jupyter and rich draw the same ``rows()``: ``viz/notebook.py``,
    ``viz/terminal.py``)."""

    report_kind = "memory"

    records: dict[str, DeviceMemory]
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, device: str) -> DeviceMemory:
        return self.records[device]

    def __iter__(self) -> Iterator[DeviceMemory]:
        return iter(self.records.values())

    def __len__(self) -> int:
        return len(self.records)

    #: The table's columns; ``rows()`` gives its cells as text.
    HEAD = (
        "device",
        "parts",
        "planned",
        "arena",
        "lower bound",
        "ratio",
        "peak",
        "reserved",
        "capacity",
        "plans hit/miss/replan",
    )

    def rows(self) -> list[tuple[str, ...]]:
        """One row of text cells per device (``HEAD``'s columns): the plain text, rich
        (``viz/terminal.py``) and HTML (``viz/notebook.py``) views all draw these."""
        out = []
        for r in self:
            cache = f"{r.hits}/{r.misses}/{r.replans}" if r.dynamic_partitions else "static"
            out.append(
                (
                    r.device,
                    str(r.partitions),
                    _human(r.planned),
                    _human(r.arena),
                    _human(r.lower_bound),
                    f"{r.ratio:.3f}",
                    _human(r.peak),
                    _human(r.reserved),
                    "unknown" if r.capacity is None else _human(r.capacity),
                    cache,
                )
            )
        return out

    def all_notes(self) -> list[str]:
        """The notes under the table: kernels that declined planned views, then ``notes``."""
        declined = [
            f"{r.device}: kernels declined {r.declined} planned out= views (they "
            "allocated their output instead)"
            for r in self
            if r.declined
        ]
        return declined + list(self.notes)

    def __str__(self) -> str:
        rows = [self.HEAD, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self.HEAD))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.extend(f"note: {n}" for n in self.all_notes())
        return "\n".join(lines)


def memory_report(compiled: Any) -> MemoryReport:
    """Memory figures per device of a ``core.compile.pipeline.CompiledModel``: plan, lower bound,
    peak, reserved, plan cache."""
    if compiled is None:
        raise AnychipError(CLOSED)  # the session's compiled model is dropped by close()
    by_name = {b.name: b for b in compiled.backends}
    records = {
        b.name: DeviceMemory(b.name, capacity=b.device.memory_capacity) for b in compiled.backends
    }
    for p in compiled.partitions:
        rec = records[p.device]
        rec.partitions += 1
        pm = compiled.part_memory.get(p.index)
        if pm is None:  # graph mode: the compiler's own plan
            rec.planned = max(rec.planned, int(p.info.get("activation_bytes", 0)))
            rec.lower_bound = max(rec.lower_bound, int(p.info.get("activation_lower_bound", 0)))
            continue
        rec.planned = max(rec.planned, pm.planned)
        rec.lower_bound = max(rec.lower_bound, pm.lower_bound)
        rec.peak = max(rec.peak, pm.program.peak)
        rec.declined += pm.program.declined
        rec.arena = max(rec.arena, pm.arena)
        rec.source = "executor"
        if pm.cache is not None:
            rec.dynamic_partitions += 1
            rec.hits += pm.cache.hits
            rec.misses += pm.cache.misses
            rec.replans += pm.cache.replans
    for name, rec in records.items():
        pool = compiled.pools.get(name)
        st = by_name[name].memory_stats()
        if st is not None:
            rec.peak, rec.reserved, rec.source = st.peak, st.reserved, "device pool"
        elif pool is not None:
            rec.reserved = pool.stats().reserved
    return MemoryReport(records, list(compiled.memory_notes))
