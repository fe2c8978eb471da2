"""Graph-compiling devices in practice: shape specialization, a compile cache, no waiting.

A backend declares its *shape policy* as data (``Backend.shape_policy``): ``"symbolic"`` (it
takes symbolic dimensions; every kernel-mode backend), ``"static"`` (it compiles for concrete
shapes only, as NPUs do). A graph-mode partition of a static-shape device becomes a
``SpecializedPartition``: one compiled executable per distinct input signature (shapes and
dtypes), kept in a bounded LRU cache (``compile_cache_size``), with counters (compiles, hits,
misses, evictions, compile seconds, runs served by the host).

A signature seen for the first time runs on the host (the CPU kernels, over copies of the
partition's inputs), which *traces* it: every intermediate value's concrete shape is recorded,
exact where shape inference may not be. The partition graph is copied with those shapes, the
device's passes run on the copy and the device compiles it, in a background thread
(``background_compile``, default on: runs keep going to the host until the compile is done,
then switch; OpenVINO's AUTO plugin does the same) or at once. A partition whose shapes are
static from the start is compiled at load the same way. A compile that fails (out of device
memory, a pass or the compiler raising) leaves that signature on the host, with the reason in
the partition's info. Outputs agree with the device's within float32 rounding: the host and
the device compute the same ops, in different kernels.

A device that compiles dynamic shapes (``shape_policy = "symbolic"``) and asks for
background compiles (``Backend.compiles_in_background``: IREE's, whose first compile of a
partition takes seconds) gets a ``dynamic`` partition: every signature has the one key
``graph_key(graph)`` (the key a compile at load stores its artifact under, so the two share
the disk cache), compiled once from the symbolic graph in the background while the host
serves.

Bucketing (``backend.buckets``, e.g. ``device_options={"npu": {"buckets": {"S": "pow2"}}}``):
when ``core/bucketing.analyse`` proves the partition safe to pad along those symbols, a run's
inputs are padded with zeros up to the bucket (through the host), the bucket's executable
runs, and its outputs are sliced back; one compile per bucket instead of per length. A graph
not proven safe runs per exact signature, with the reason in its info (``bucketing``).

Every compile has ``timeout`` seconds (``compile_timeout``; ``budget.py``): one that runs past
it is abandoned and its signature stays on the host (``strict``: its runs raise), with the
reason in the info; ``close()`` stops the compiles still running instead of waiting for them.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from anychip.core.compile.static_shapes import steering_inputs
from anychip.core.plugin.budget import Deadline, within
from anychip.errors import CompileTimeout, DeviceError
from anychip.ir.clone import copy_model
from anychip.ir.graph import Graph, Model

__all__ = ["SpecializedPartition", "graph_key", "signature", "concrete_graph"]

log = logging.getLogger("anychip")

#: Seconds ``close()`` gives a stopped compile to end (a cooperative one ends at its next
#: checkpoint, within milliseconds; one deaf to its deadline is left to finish alone).
CLOSE_GRACE = 1.0


def signature(tensors: Sequence[Any]) -> tuple:
    """The key of a run: each input's shape and dtype."""
    return tuple((tuple(t.shape), str(np.dtype(t.dtype))) for t in tensors)


def graph_key(graph: Graph) -> tuple:
    """The signature of ``graph``'s declared inputs (symbols as they are): the one key of a
    ``dynamic`` partition, and of a partition compiled at load (``per_signature.static_key``)."""
    return tuple(
        (tuple(v.shape or ()), str(v.dtype.numpy) if v.dtype else "?") for v in graph.inputs
    )


def release_executables(executables: list[tuple[Any, Any]]) -> None:
    """Give each ``(backend, CompiledGraph)`` back to its backend
    (``Backend.release_compiled``), once; one that raises is logged (this runs at close and
    from the collector, where nothing may escape)."""
    while executables:
        backend, compiled = executables.pop()
        try:
            backend.release_compiled(compiled)
        except Exception as e:
            log.warning(
                "anychip: %s.release_compiled raised %s: %s", backend.name, type(e).__name__, e
            )


def _release_all(backend: Any, executables: dict[tuple, Any], evicted: list) -> None:
    held = list(evicted) + [(backend, c) for c in executables.values()]
    evicted.clear()
    executables.clear()
    release_executables(held)


def concrete_graph(graph: Graph, shapes: dict[str, tuple[int, ...]]) -> Graph:
    """A copy of ``graph`` whose values named in ``shapes`` have those concrete shapes."""
    g = copy_model(Model(graph)).graph
    for v in g.values():
        if v.name in shapes:
            v.shape = tuple(int(d) for d in shapes[v.name])
    return g


class SpecializedPartition:
    """One partition of a static-shape graph-mode device, compiled per input signature.

    Called by the step runner with the partition's inputs as device tensors; returns its
    outputs as device tensors, computed on the device when this signature is compiled, else
    on the host (see the module docstring).
    """

    def __init__(
        self,
        graph: Graph,
        backend: Any,
        host_program: Any,
        *,
        cache_size: int = 8,
        background: bool = True,
        info: dict | None = None,
        disk: Any = None,
        strict: bool = False,
        dynamic: bool = False,
        timeout: float | None = None,
        what: str = "",
    ) -> None:
        self.graph = graph
        #: Each compile's budget in seconds (None: no limit), and the compiles running now.
        self.timeout = timeout
        self.what = what or f"compile on {backend.name}"
        self._deadlines: set[Deadline] = set()
        self._closed = False
        #: One executable for every signature, compiled from the symbolic graph (``graph_key``).
        self.dynamic = dynamic
        self._whole = graph_key(graph) if dynamic else None
        #: A signature whose compile failed raises ``DeviceError`` (``strict=True``) instead
        #: of running on the host for good (issue 47: strict was ignored there).
        self.strict = strict
        self.backend = backend
        self.host_program = host_program
        self.cache_size = max(1, int(cache_size))
        self.background = background
        self.info = info if info is not None else {}
        self.cache: OrderedDict[tuple, Any] = OrderedDict()
        self.pending: set[tuple] = set()
        self.failed: dict[tuple, str] = {}
        self.disk = disk
        self._graph_digest: str | None = None
        self.stats = {
            "compiles": 0,
            "disk_hits": 0,
            "hits": 0,
            "misses": 0,
            "evictions": 0,
            "host_runs": 0,
            "bucketed_runs": 0,
        }
        self.compile_seconds = 0.0
        self.bucketing = self._bucket_plan(backend.buckets)
        #: Inputs whose values decide shapes (``static_shapes.steering_inputs``): in the key.
        self.steering = steering_inputs(graph)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._deferred: list[threading.Thread] = []
        #: The ``CompiledGraph`` behind each cached run, and those evicted since the last run
        #: (given back to the backend by the next run: never while one runs), then all of them
        #: at ``close()`` or when the partition is collected (``Backend.release_compiled``).
        self.executables: dict[tuple, Any] = {}
        self._evicted: list[tuple[Any, Any]] = []
        self.release = weakref.finalize(
            self, _release_all, backend, self.executables, self._evicted
        )

    def _bucket_plan(self, rules: Any) -> Any:
        """The bucketing plan of this partition, or None (with why in the info)."""
        if not rules:
            return None
        from anychip.core.compile.bucketing import analyse

        plan = analyse(self.graph, rules)
        if isinstance(plan, str):
            self.info["bucketing"] = f"refused: {plan}"[:300]
            log.info("anychip: %s: no bucketing: %s", self.backend.name, plan)
            return None
        self.info["bucketing"] = plan.describe()
        return plan

    # -- the run -------------------------------------------------------------------------------
    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        plan = self.bucketing
        if plan is not None:
            targets = plan.targets([tuple(t.shape) for t in inputs])
            if targets and any(n != b for n, b in targets.values()):
                return self._bucketed(inputs, plan, targets)
        return self._run(inputs)

    def _bucketed(self, inputs: Sequence[Any], plan: Any, targets: dict) -> list[Any]:
        """Pad the inputs to their bucket (through the host), run, slice the outputs back.
        Only the tensors that carry a bucketed dimension make the trip."""
        be = self.backend
        host = [be.to_host(t) if axes else t for t, axes in zip(inputs, plan.inputs)]
        padded = plan.pad(host, targets)
        fresh = [be.to_device(a) if axes else a for a, axes in zip(padded, plan.inputs)]
        try:
            outs = self._run(fresh)
        finally:
            for f, axes in zip(fresh, plan.inputs):
                if axes:
                    be.release(f)
        back = [be.to_host(o) if axes else o for o, axes in zip(outs, plan.outputs)]
        for o, axes in zip(outs, plan.outputs):
            if axes:
                be.release(o)
        self.stats["bucketed_runs"] += 1
        cut = plan.slice(back, targets)
        return [be.to_device(c) if axes else c for c, axes in zip(cut, plan.outputs)]

    def _run(self, inputs: Sequence[Any]) -> list[Any]:
        if self._whole is not None:  # one dynamic compile serves every shape and value
            key = self._whole
        else:
            key = signature(inputs)
            if self.steering:  # their values decide shapes: each value is its own compile
                key += tuple(
                    ("value", i, np.asarray(self.backend.to_host(inputs[i])).tobytes())
                    for i in self.steering
                )
        if self._evicted:  # runs are serialised: none of them is running now
            with self._lock:
                evicted, self._evicted[:] = list(self._evicted), []
            release_executables(evicted)
        with self._lock:
            run = self.cache.get(key)
            if run is not None:
                self.cache.move_to_end(key)
                self.stats["hits"] += 1
            else:
                self.stats["misses"] += 1
                trace = key not in self.pending and key not in self.failed
                if trace:
                    self.pending.add(key)
        if run is None and trace and self.disk is not None and not self.background:
            # Compiled by an earlier process: no trace needed. In the background mode the
            # host serves this run and the compile thread looks on disk first: loading the
            # light ResNet-50's executable (hashing the partition, reading and checking its
            # 100 MB, placing the weights) takes 0.4-0.6 s (it took 0.95 s when the artifact
            # was an ONNX graph compiled again), the host run 60 ms.
            run = self._from_disk(key)
        if run is not None:
            return list(run(inputs))
        if self.strict and key in self.failed:
            raise DeviceError(
                f"{self.backend.name}: compiling this partition for input signature {key} "
                f"failed ({self.failed[key]}); with strict=True it does not run on the host "
                "instead: load without strict to let the host serve it"
            )
        return self._on_host(inputs, key, trace)

    def _from_disk(self, key: tuple) -> Any:
        """The executable of ``key`` from the disk cache (compiling its stored graph), or
        None; only the artifact's own graph is needed, not a trace."""
        self._compile(key, None, disk_only=True)
        with self._lock:
            return self.cache.get(key)

    def _on_host(self, inputs: Sequence[Any], key: tuple, trace: bool) -> list[Any]:
        """Run on the host over copies of the inputs; when ``trace``, record the shapes and
        compile this signature for the device."""
        be = self.backend
        host_inputs = [be.to_host(t) for t in inputs]
        record: dict | None = {} if trace and not self.dynamic else None
        try:
            outs = self.host_program.run(host_inputs, record=record)
        except BaseException:
            if trace:
                with self._lock:
                    self.pending.discard(key)
            raise
        self.stats["host_runs"] += 1
        runs = self.stats["hits"] + self.stats["misses"]
        self.info["runs_on_host"] = f"{self.stats['host_runs']} of {runs}"  # the report's truth
        if trace:  # a dynamic partition compiles its symbolic graph: no shapes to record
            self.compile(key, None if record is None else self._shapes(host_inputs, record))
        return [be.to_device(np.asarray(o)) for o in outs]

    def _shapes(self, host_inputs: list[Any], record: dict) -> dict[str, tuple[int, ...]]:
        slot_of = self.host_program.slot_of
        shapes = {v.name: tuple(np.shape(a)) for v, a in zip(self.graph.inputs, host_inputs)}
        for v, s in slot_of.items():
            if s in record:
                shapes[v.name] = tuple(record[s][0])
        return shapes

    # -- compiling -----------------------------------------------------------------------------
    def compile(self, key: tuple, shapes: dict[str, tuple[int, ...]] | None) -> None:
        """Compile ``key`` (in the background when asked); ``shapes`` None: already static."""
        with self._lock:
            self.pending.add(key)
        if not self.background:
            self._compile(key, shapes)
            return
        t = threading.Thread(
            target=self._compile, args=(key, shapes), name="anychip-compile", daemon=True
        )
        self._threads.append(t)
        # Started once the request is answered (``start_compiles``): the compile thread holds
        # the GIL for long stretches (serialising the graph), and started here it added 40 ms
        # to the end of ResNet-50's first run.
        self._deferred.append(t)

    def start_compiles(self) -> None:
        """Start the background compiles the runs so far asked for."""
        while self._deferred:
            self._deferred.pop(0).start()

    def _compile(
        self, key: tuple, shapes: dict[str, tuple[int, ...]] | None, disk_only: bool = False
    ) -> None:
        """Load ``key``'s executable from disk, else (unless ``disk_only``) compile it there.

        Nothing weight-sized is copied on the way: the digest hashes the arrays where they
        lie, the concrete graph shares them, and the executable's bytes (one copy, made by the
        backend's ``serialize``) go to the file as they are."""
        from anychip.core.compile.cache import cache_key, compile_and_store, load_cached

        t0 = time.perf_counter()

        def build() -> tuple[Any, bool]:
            disk_key = None
            if self.disk is not None and getattr(self.backend, "loads_compiled", False):
                disk_key = cache_key(self.backend, self.disk, self._digest(), key)
            compiled = load_cached(self.backend, self.disk, disk_key)
            if compiled is not None or disk_only:  # not on disk: the host run that follows
                return compiled, True  # traces and compiles it
            g = concrete_graph(self.graph, shapes or {})  # the passes rewrite it
            return compile_and_store(self.backend, g, self.disk, disk_key), False

        deadline = Deadline(self.timeout, self.what)
        with self._lock:
            self._deadlines.add(deadline)
            if self._closed:
                deadline.stop("because its session closed")
        try:
            compiled, from_disk = within(deadline, build, late=self._give_back)
        except Exception as e:
            why = full = f"{type(e).__name__}: {e}"
            if isinstance(e, CompileTimeout):  # the report's words: what ran where, and why
                why, full = f"{deadline.what} abandoned {deadline.reason}; ran on the host", str(e)
            with self._lock:
                self.pending.discard(key)
                self.failed[key] = full  # strict: the error of the runs, with what to do
            self.info["host_only"] = f"{len(self.failed)} signature(s): {why}"[:300]
            log.warning("anychip: %s: compiling for %s failed: %s", self.backend.name, key, why)
            return
        finally:
            with self._lock:
                self._deadlines.discard(deadline)
        if compiled is None:
            with self._lock:
                self.pending.discard(key)
            return
        elapsed = time.perf_counter() - t0
        with self._lock:
            closed = self._closed  # finished as the session closed: nothing will run it
            if not closed:
                self._keep(key, compiled, from_disk, elapsed)
        if closed:
            self._give_back(compiled)

    def _keep(self, key: tuple, compiled: Any, from_disk: bool, elapsed: float) -> None:
        """Cache ``key``'s executable (under the lock), evicting the least recently used."""
        self.pending.discard(key)
        self.cache[key] = compiled.run
        self.executables[key] = compiled
        self.cache.move_to_end(key)
        self.stats["disk_hits" if from_disk else "compiles"] += 1
        self.compile_seconds += elapsed
        while len(self.cache) > self.cache_size:
            old, _ = self.cache.popitem(last=False)
            if old in self.executables:
                self._evicted.append((self.backend, self.executables.pop(old)))
            self.stats["evictions"] += 1
        self.info.update(compiled.info)
        self.info["compiles"] = self.stats["compiles"]

    def compiling(self) -> bool:
        """Whether a compile asked for has not finished (its runs go to the host meanwhile)."""
        return bool(self._deferred) or any(t.is_alive() for t in self._threads)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background compiles asked for so far; True when none is left."""
        self.start_compiles()
        for t in list(self._threads):
            t.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    def _give_back(self, compiled: Any) -> None:
        """An executable nothing will run (a compile abandoned, or done after ``close``)."""
        release_executables([(self.backend, compiled)])

    def close(self, timeout: float | None = 60) -> None:
        """Start no more compiles, stop the running ones (a compile that does not stop is
        abandoned, ``budget.py``), drop every executable (their device memory goes back with
        them)."""
        self._deferred.clear()
        with self._lock:
            self._closed = True
            running = list(self._deadlines)
        for d in running:  # a compile that stops gives its executable back; a hung one is
            d.stop_and_wait("because its session closed", grace=CLOSE_GRACE)  # left behind
        for t in list(self._threads):
            if t.ident is not None:
                t.join(timeout)
        self._threads.clear()
        with self._lock:
            self.cache.clear()
        self.release()

    def _digest(self) -> str:
        """The symbolic partition graph's digest, computed once (it keys disk artifacts)."""
        from anychip.core.compile.cache import graph_digest

        with self._lock:
            if self._graph_digest is None:
                self._graph_digest = graph_digest(self.graph)
            return self._graph_digest

    def telemetry(self) -> dict[str, Any]:
        """Compiles, hits, misses, evictions, host runs, compile seconds, cached signatures."""
        with self._lock:
            return dict(
                self.stats,
                disk=dict(self.disk.stats) if self.disk is not None else None,
                compile_seconds=round(self.compile_seconds, 6),
                cached=len(self.cache),
                compiling=len(self.pending),
                failed=len(self.failed),
            )
