"""Measured costs: each device timed where it runs, cached on disk per backend and machine.

A backend's ``DeviceModel`` figures (FLOP/s, bandwidth, link) are a datasheet guess; for a
new chip, or a simulated one, they say little about this machine. ``calibrate(backend)`` times
the device itself, through the public path a model takes (a one-node model loaded on
``[device]`` and run), for each *op class* at a few sizes, and the host link (copies in and
out at a few sizes). The cost model (``core/plan/cost.py``) then reads a node's time from the
measured points of its class (piecewise linear in work: elements, or FLOPs for MatMul and
Conv) and a copy's time from the measured link; a class that could not be measured keeps the
declared figures.

Op classes and what stands for them: ``elementwise`` (Add), ``matmul`` (MatMul of two
activations, as in attention), ``linear`` (MatMul by a constant weight; Gemm with a constant B
too: backends pack such weights once, so it runs at another speed), ``conv`` (3x3 Conv),
``reduce`` (Softmax; reductions and normalizations), ``data`` (Transpose; the data-movement
ops), ``data_rows`` (a Transpose that keeps the last axis, as attention's head splits do: a
copy of whole rows, several times faster per element than the 2-D transpose that stands for
``data``; ``cost.node_time`` prices such Transposes with it), ``attention`` (MatMul, Mul,
Softmax, MatMul over 8 heads of 32: the chain the backends fuse into one kernel, measured as
the device runs it; ``core/plan/cost_patterns.py`` prices such chains with it, in FLOPs of the two
products).

The machine may be busy while it calibrates, and load only ever adds time: each probe is the
fastest of its runs, timed again while a round's runs spread widely (``best_of``), and every
class is swept twice, each point the faster of the two (a burst spanning one probe's rounds
does not span both sweeps). How far the two sweeps disagree is kept per class (``spread``):
it is the figures' own uncertainty, which placement weighs a gain against
(``core/plan/uncertainty.py``, decisions/032).

The element-wise ops and LayerNormalization differ too much within a class (numpy's float32
power is a hundred Adds), so each is also measured on its own (``op:<type>`` points), and a
masked attention chain has its class beside the unmasked one (``attention_mask``).

Graph-mode devices (IREE's, the NPU's) run a partition per call, and a call has a cost of
its own beside its nodes' work (IREE's ``FunctionInvoker``, the arrays in and out: tens of
microseconds to a millisecond): ``launch`` is measured as the time of a one-element Add on the
device beyond the host's time for the same one-node model (``calibration_probes.
measure_launch``), so every class point of such a device holds one launch, which the cost
model takes out of each node and charges once per partition call (``cost_search.Costs``).

Complete and fixed (format 7): every probe a placement could read is measured up front, in
one calibration; pricing a placement never measures, and nothing rewrites the file but
``anychip calibrate`` (which numbers each calibration, ``version``). So the same model on the
same machine gets the same placement every time.

Cache: ``<cache>/calibration/<device>-<key>.json`` where the key hashes the backend's class and
``version``, anychip's and numpy's versions, and the machine (architecture, CPU model, cores).
A file with another key is never read; a corrupt one is measured again and replaced.
``anychip calibrate [--device X] [--clear]`` runs or clears it. A load never waits for a
calibration (``calibrations``): a device with none here is placed on its declared figures and
measured in a background thread for the loads that follow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from anychip.core.progress import task
from anychip.paths import cache_root, write_atomic

__all__ = [
    "Calibration",
    "calibrate",
    "load_calibration",
    "calibration_for",
    "calibrations",
    "resolve_calibration_mode",
    "clear_calibrations",
    "cache_root",
    "op_class",
    "keys",
]

# 3: attention class; 4: static-shape devices on their executables; 5: robust probes; 6:
# complete up front (per-op and masked-attention points), spreads, versions; 7: launch
FORMAT = 7
_CLASSES = (
    "elementwise",
    "matmul",
    "linear",
    "conv",
    "reduce",
    "data",
    "data_rows",
    "attention",
    "attention_mask",
)
_MATMUL = {"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "FusedMatMul"}
_CONV = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "NpuConv"}
_REDUCE = {
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "BatchNormalization",
    "InstanceNormalization",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "AveragePool",
    "MaxPool",
    "NpuPool",
    "LRN",
} | {f"Reduce{s}" for s in ("Sum", "Mean", "Max", "Min", "Prod", "L1", "L2", "LogSumExp")}
_DATA = {
    "Transpose",
    "Concat",
    "Slice",
    "Split",
    "Gather",
    "Pad",
    "Tile",
    "Expand",
    "Resize",
    "DepthToSpace",
    "SpaceToDepth",
}


def op_class(op_type: str, const_weight: bool = False, rows: bool = False) -> str:
    """The measured class whose points estimate ``op_type`` (``const_weight``: a MatMul or
    Gemm whose second operand is a constant, the ``linear`` class; ``rows``: a Transpose that
    keeps the last axis, or a Concat, Split, Slice: the ``data_rows`` class)."""
    if op_type in _DATA and rows:
        return "data_rows"
    if op_type in _MATMUL:
        return "linear" if const_weight else "matmul"
    if op_type in _CONV:
        return "conv"
    if op_type in _REDUCE:
        return "reduce"
    if op_type in _DATA:
        return "data"
    return "elementwise"


def op_key(op_type: str) -> str | None:
    """The key of ``op_type``'s own measured points, for the ops measured one by one
    (``calibration_probes.OP_PROBES``: the element-wise ops and LayerNormalization)."""
    from anychip.core.plan.calibration_probes import OP_PROBES

    return f"op:{op_type}" if op_type in OP_PROBES else None


def keys() -> list[str]:
    """Every key a calibration measures: the classes, then each op measured on its own."""
    from anychip.core.plan.calibration_probes import OP_PROBES

    return [*_CLASSES, *(f"op:{op}" for op in OP_PROBES)]


@dataclass
class Calibration:
    """Measured figures of one device on this machine.

    ``points[class]`` is a sorted list of ``(work, seconds)``; ``link`` is ``(latency s,
    bandwidth B/s)`` of a host round trip one way, or None for host memory.
    """

    device: str
    key: str
    points: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    link: tuple[float, float] | None = None
    seconds: float = 0.0
    #: The machine's load average when the classes were measured (None: unknown), and when
    #: (seconds since the epoch).
    load: float | None = None
    when: float = 0.0
    #: Per key, how far the sweeps disagreed (the largest of (slow - fast) / fast over its
    #: points): the figures' relative uncertainty, read by ``uncertainty``.
    spread: dict[str, float] = field(default_factory=dict)
    #: 1 for a device's first calibration here, one more for each ``anychip calibrate``.
    version: int = 1
    #: Seconds one call of a graph-mode device's partition costs beyond the host's run of the
    #: same one-node model (None: a kernel-mode device, or not measured).
    launch: float | None = None

    def uncertainty(self, key: str) -> float:
        """Relative uncertainty of a time read from ``key``'s points: the sweeps' spread, at
        least ``MIN_UNCERTAINTY`` (reading between probe sizes is itself an estimate)."""
        return max(MIN_UNCERTAINTY, self.spread.get(key, DEFAULT_SPREAD))

    def time(self, cls: str, work: float) -> float | None:
        """Seconds for ``work`` units of ``cls`` (piecewise linear through the measured
        points, the end segments extended), or None when ``cls`` was not measured."""
        pts = self.points.get(cls)
        if not pts:
            return None
        if len(pts) == 1:
            w0, t0 = pts[0]
            return t0 * max(work / w0, 1e-3) if w0 else t0
        i = next((i for i in range(1, len(pts) - 1) if work <= pts[i][0]), len(pts) - 1)
        (w0, t0), (w1, t1) = pts[i - 1], pts[i]
        slope = max((t1 - t0) / (w1 - w0), 0.0) if w1 > w0 else 0.0
        return max(t0 + slope * (work - w0), min(t for _, t in pts) * 0.5)

    def copy_time(self, nbytes: int) -> float:
        if self.link is None:
            return 0.0
        latency, bandwidth = self.link
        return latency + nbytes / bandwidth

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "device": self.device,
            "key": self.key,
            "points": {k: [list(p) for p in v] for k, v in self.points.items()},
            "link": list(self.link) if self.link else None,
            "seconds": self.seconds,
            "load": self.load,
            "when": self.when,
            "spread": self.spread,
            "version": self.version,
            "launch": self.launch,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        if data.get("format") != FORMAT:
            raise ValueError(f"calibration format {data.get('format')!r}, expected {FORMAT}")
        points = {
            str(k): sorted((float(w), float(t)) for w, t in v) for k, v in data["points"].items()
        }
        for k, v in points.items():
            known = k in _CLASSES or op_key(k[3:]) == k
            if not known or any(not (w >= 0 and t > 0) for w, t in v):
                raise ValueError(f"bad calibration points for {k!r}")
        link = data.get("link")
        link_t = (float(link[0]), float(link[1])) if link else None
        if link_t is not None and not (link_t[0] >= 0 and link_t[1] > 0):
            raise ValueError("bad link figures")
        load = data.get("load")
        load_f = None if load is None else float(load)
        when = float(data.get("when", 0.0))
        spread = {str(k): float(v) for k, v in data.get("spread", {}).items()}
        if any(not (v >= 0) for v in spread.values()):
            raise ValueError("bad spreads")
        launch = data.get("launch")
        launch_f = None if launch is None else float(launch)
        if launch_f is not None and not (0 <= launch_f < 10):
            raise ValueError("bad launch figure")
        return cls(
            str(data["device"]),
            str(data["key"]),
            points,
            link_t,
            float(data["seconds"]),
            load_f,
            when,
            spread,
            int(data.get("version", 1)),
            launch_f,
        )


# -- the cache ---------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def cache_key(backend: Any) -> str:
    """What a calibration depends on: the backend (class, version), anychip and numpy, the
    machine. Any change makes a new key, so stale figures are never read."""
    from anychip.version import __version__

    parts = [
        f"{type(backend).__module__}.{type(backend).__qualname__}",
        str(backend.version),
        __version__,
        np.__version__,
        platform.machine(),
        _cpu_model(),
        str(os.cpu_count()),
        str(FORMAT),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _path(backend: Any) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in backend.name)
    return cache_root() / "calibration" / f"{safe}-{cache_key(backend)}.json"


def load_calibration(backend: Any) -> Calibration | None:
    """The cached calibration of ``backend`` for this machine, or None (missing, foreign or
    corrupt: a corrupt file is removed so the next calibration replaces it)."""
    path = _path(backend)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        cal = Calibration.from_json(data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return None
    return cal if cal.key == cache_key(backend) and cal.device == backend.name else None


def _save(backend: Any, cal: Calibration) -> None:
    # Atomic (a reader sees the old file or the new one), one temporary name per process and
    # thread (``calibrate`` may be called from threads directly), room reserved in the bounded
    # store first (paths.py).
    write_atomic(_path(backend), json.dumps(cal.to_json()).encode("utf-8"))


def clear_calibrations(device: str | None = None) -> int:
    """Remove cached calibrations (of ``device`` only, when given); the number removed."""
    folder = cache_root() / "calibration"
    if not folder.is_dir():
        return 0
    n = 0
    for p in folder.glob("*.json"):
        if device is None or p.name.rsplit("-", 1)[0] == device:
            p.unlink(missing_ok=True)
            n += 1
    for p in folder.glob("*.json.partial"):  # an interrupted calibration's probes
        if device is None or p.name.rsplit("-", 1)[0] == device:
            p.unlink(missing_ok=True)
    return n


MODES = ("auto", "cached", "off")
_lock = threading.RLock()
#: Set at interpreter exit (``calibration_background``): a probe in flight ends after its
#: current call, so no device runtime is left working while the process shuts down.
STOP = threading.Event()


class CalibrationStopped(Exception):
    """A calibration ended by ``STOP`` (the process is exiting): nothing is saved."""


def resolve_calibration_mode(mode: str | None) -> str:
    """``mode``, else ``$ANYCHIP_CALIBRATION``, else ``"auto"``; checked against ``MODES``."""
    from anychip.errors import AnychipError

    chosen = mode if mode is not None else os.environ.get("ANYCHIP_CALIBRATION", "auto")
    if chosen not in MODES:
        where = "calibration=" if mode is not None else "ANYCHIP_CALIBRATION"
        raise AnychipError(f"{where} is {chosen!r}; use one of {', '.join(MODES)}")
    return chosen


def calibration_for(backend: Any, *, measure: bool = True) -> Calibration | None:
    """The cached calibration, measured now (and cached) when missing and ``measure``. A
    device that fails to calibrate keeps its declared figures (None)."""
    from anychip.errors import AnychipError

    with _lock:
        cal = load_calibration(backend)
        if cal is None and measure and backend.available()[0]:  # unavailable: no try
            try:
                cal = calibrate(backend)
            except (AnychipError, OSError) as e:
                logging.getLogger("anychip").warning(
                    "anychip: calibrating %s failed (%s); its declared figures are used",
                    backend.name,
                    e,
                )
        return cal


def calibrations(backends: list[Any], mode: str) -> dict[str, Calibration]:
    """The calibration of each backend under ``mode`` (see ``resolve_calibration_mode``).

    A load never waits for a measurement: under ``"auto"`` a device with no calibration here
    (a new device, a new machine) is placed on its declared figures and measured in a
    background thread (``calibration_background.py``) for the loads after it. A cached one is
    never measured again here (the same placement every time); ``anychip calibrate`` measures
    at once."""
    if mode == "off":
        return {}
    found = {}
    for b in backends:
        cal = load_calibration(b)
        if mode == "auto" and cal is None and b.available()[0]:
            from anychip.core.plan.calibration_background import measure_in_background

            measure_in_background(b)
        if cal is not None:
            found[b.name] = cal
    return found


#: Sweeps over the classes in a calibration (each point the fastest of its sweeps).
SWEEPS = 2


def _faster(
    old: list[tuple[float, float]] | None, new: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Per probe (the same works, in order), the lower time of ``old`` and ``new``."""
    if not old or [w for w, _ in old] != [w for w, _ in new]:
        return new
    return [(w, min(t0, t1)) for (w, t0), (_, t1) in zip(old, new)]


#: Relative uncertainty of measured figures at the least, and where a key has no spread.
MIN_UNCERTAINTY = 0.1
DEFAULT_SPREAD = 0.25


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not on this platform
        return None


def _spread(sweeps: list[list[tuple[float, float]]]) -> float:
    """The largest relative disagreement between sweeps over their common points."""
    worst = 0.0
    for pts in zip(*sweeps):
        ts = [t for _, t in pts]
        worst = max(worst, (max(ts) - min(ts)) / min(ts))
    return worst


class Progress(Protocol):
    """Where a calibration keeps the probes measured so far (``calibration_background``'s
    file, so a process that exits midway leaves them to the next one)."""

    def get(self, sweep: int, key: str) -> list[tuple[float, float]] | None: ...

    def put(self, sweep: int, key: str, points: list[tuple[float, float]]) -> None: ...


def calibrate(
    backend: Any,
    *,
    repeat: int = 5,
    since: Calibration | None = None,
    save: bool = True,
    progress: Progress | None = None,
) -> Calibration:
    """Measure every key (``keys()``) of ``backend`` now (a few seconds), cache (unless
    ``save`` is False) and return the figures. ``since``: the calibration this one replaces
    (``anychip calibrate``): the new one's ``version`` is one more. ``progress``: probes an
    earlier, interrupted calibration measured (taken as they are) and where this one's go."""
    from anychip.core.plan.calibration_probes import measure_class, measure_launch, measure_link

    t0 = time.perf_counter()
    cal = Calibration(backend.name, cache_key(backend), load=_load_average(), when=time.time())
    if since is not None:
        cal.version = since.version + 1
    all_keys = keys()
    sweeps: dict[str, list[list[tuple[float, float]]]] = {}
    with task(f"calibrating {backend.name}", SWEEPS * len(all_keys)) as advance:
        # Every class twice, a sweep apart, each point the faster of the two: a burst of
        # another process's work that spans one probe's rounds does not span both sweeps;
        # how far they disagree is the figures' uncertainty.
        for sweep in range(SWEEPS):
            for k in all_keys:
                pts = progress.get(sweep, k) if progress is not None else None
                if pts is None:
                    pts = measure_class(backend, k, repeat)
                    if progress is not None:
                        progress.put(sweep, k, pts)
                if pts:
                    cal.points[k] = _faster(cal.points.get(k), pts)
                    sweeps.setdefault(k, []).append(pts)
                advance(1)
    cal.spread = {k: _spread(v) for k, v in sweeps.items() if len(v) > 1}
    if getattr(backend, "graph_mode", False):
        cal.launch = measure_launch(backend, repeat)
    if not backend.host_memory:
        cal.link = measure_link(backend, repeat)
    cal.seconds = time.perf_counter() - t0
    if save:
        _save(backend, cal)
    return cal


#: A probe whose median run is more than this over its fastest was disturbed (another process
#: took a core for part of it): it is timed again, at most ``MAX_ROUNDS`` rounds in all.
WIDE = 1.3
MAX_ROUNDS = 3


def best_of(
    fn: Callable[[], Any], repeat: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """The fastest of ``repeat`` timed calls, after one untimed warm-up call; when a round's
    calls spread widely (their median over ``WIDE`` times the fastest so far), ``repeat`` more,
    up to ``MAX_ROUNDS`` rounds, and the fastest of all (load only ever adds time).
    Raises ``CalibrationStopped`` once ``STOP`` is set."""
    if STOP.is_set():
        raise CalibrationStopped
    fn()
    best = float("inf")
    for _ in range(MAX_ROUNDS):
        times = []
        for _ in range(repeat):
            if STOP.is_set():
                raise CalibrationStopped
            t = clock()
            fn()
            times.append(clock() - t)
        best = min(best, *times)
        if sorted(times)[len(times) // 2] <= WIDE * best:  # this round's runs agree
            break
    return best
