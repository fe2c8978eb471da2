"""``Session`` and ``load``: a model compiled for a set of devices, run like onnxruntime.

A facade: ``core/compile/pipeline.py`` compiles (on a copy of the caller's model),
``core/run/steps.py``
runs the steps, ``core/api/feeds.py`` checks feeds and outputs, ``core/run/feedback.py`` and
``core/run/failover.py`` watch the runs.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from anychip.core.api import device_values, dlpack
from anychip.core.api.feeds import Feeds, IOInfo, detach, random_feeds
from anychip.core.api.options import SessionOptions, resolve_precision
from anychip.core.api.ort_api import (
    AsyncRunner,
    IOBinding,
    ModelMetadata,
    guarded_run,
    model_metadata,
)
from anychip.core.api.remembered import start_from_memory
from anychip.core.compile.gcpause import gc_paused
from anychip.core.compile.pipeline import CompiledModel, CompileOptions, compile_model, disk_for
from anychip.core.plan.calibration import resolve_calibration_mode
from anychip.core.plan.calibration_probes import set_probe_opener
from anychip.core.plan.devices import resolve_devices
from anychip.core.plan.placement import PlacementOptions, set_policy
from anychip.core.plugin.host import get_registry
from anychip.core.progress import task
from anychip.core.report.memory import MemoryReport, memory_report
from anychip.core.report.placement import PlacementReport, log_fallbacks, placement_report
from anychip.core.report.profile import Profile, profile_session
from anychip.core.run import forks
from anychip.core.run.bring_up import memory_in_use
from anychip.core.run.failover import run_request
from anychip.core.run.feedback import Feedback
from anychip.core.run.lifecycle import Closable, check_open
from anychip.errors import AnychipError, DeviceError
from anychip.ir.graph import Model
from anychip.ir.onnx import import_model

__all__ = ["Session", "SessionOptions", "IOInfo", "load", "resolve_devices"]


class Session(Closable):
    """A model compiled for a list of devices (``anychip.load`` makes one). ``model`` is the
    compiled copy (placement marks on its nodes); the caller's model is never modified. ``run``
    is serialised by a lock; ``close()`` or a with-block frees device memory at once."""

    def __init__(
        self,
        model: Model,
        devices: list[str],
        options: PlacementOptions,
        device_options: Mapping[str, Mapping[str, Any]] | None = None,
        copts: CompileOptions | None = None,
    ) -> None:
        registry = get_registry(devices)
        # device names are case-insensitive (openvino:CPU is openvino:cpu): so are these keys
        device_options = {str(k).lower(): v for k, v in (device_options or {}).items()}
        if unknown := sorted(set(device_options) - set(devices)):
            raise DeviceError(f"device_options name {unknown}, not among the devices {devices}")
        copts = copts or CompileOptions()
        #: The model as imported (before anychip's passes): what ``export_compiled`` writes.
        self.source_model: Model | None = model
        self._disk = disk_for(copts)
        self._disk_mark = len(self._disk.touched) if self._disk is not None else 0
        #: The load options an exported archive carries (``core/api/export.py``).
        self.export_options: dict[str, Any] = {}
        backends = [registry.backends[d].configure(**device_options.get(d, {})) for d in devices]

        def compile_with(
            factors: dict[str, float], devices: Any = None, policy: str | None = None
        ) -> CompiledModel:
            opts = copy.copy(options)
            opts.factors = factors
            set_policy(opts, policy)
            devs = [b for b in backends if devices is None or b.name in devices]
            return compile_model(model, devs, opts, registry, copts)

        #: Devices a run found failing, with the error (``core/run/failover.py``), and the
        #: nodes each ran before it failed.
        self.unhealthy: dict[str, str] = {}
        self.failed_over: dict[str, list[str]] = {}
        #: Bring-up: each own-memory device's bytes in use before loading, checked at close().
        self._memory_at_load = memory_in_use(backends) if copts.bring_up else None
        self._compile_with = compile_with if len(devices) > 1 else None
        self.devices, self.options = devices, options
        t0 = time.perf_counter()
        self._use(compile_with(options.factors))
        #: The first runs measured and, once, a better placement taken (``core/run/feedback.py``).
        self.feedback = Feedback.for_session(compile_with, options, len(devices))
        if self.feedback is not None:  # what a trial's compile is expected to cost
            self.feedback.compile_cost = time.perf_counter() - t0
        # a decision measured by an earlier session of this model (core/api/remembered.py)
        start_from_memory(self, model, backends, options, compile_with, options.remember)
        graph = self.model.graph
        self.inputs = [IOInfo(v) for v in graph.inputs]
        self.outputs = [IOInfo(v) for v in graph.outputs]
        self._feeds = Feeds(graph.inputs, graph.outputs)
        self._lock = threading.RLock()
        self._async: AsyncRunner | None = None
        #: ``enable_profiling``'s file prefix (None: off); the last feeds, for end_profiling.
        self.profiling: str | None = None
        self._last_feeds: dict[str, Any] | None = None
        forks.track(self)  # a child forked mid-run gets a clear error (core/run/forks.py)
        unavailable = {b.name: b.available()[1] for b in backends if not b.available()[0]}
        log_fallbacks(self.model.graph, devices, unavailable)

    def _use(self, c: CompiledModel) -> None:
        #: What compilation produced (partitions, steps, memory): for inspection.
        self.compiled, self.model = c, c.model
        self.partitions, self.copies = c.partitions, c.copies
        self.folded, self.optimizations = c.folded, c.optimizations

    def get_inputs(self) -> list[IOInfo]:  # onnxruntime's spelling
        return self.inputs

    def get_outputs(self) -> list[IOInfo]:  # onnxruntime's spelling
        return self.outputs

    def placement(self) -> PlacementReport:
        """Which node runs where and why, the partitions, the copies per run (with the bytes the
        runs measured), and the cost model's estimate and feedback decision."""
        return placement_report(self)

    def memory(self) -> MemoryReport:
        """Memory per device: plan, lower bound, peak, reserved, plan cache (memory/report)."""
        return memory_report(self.compiled)

    def end_profiling(self) -> str:
        """With ``enable_profiling``: the profile of the last feeds run (re-run under the
        profiler) written as a Perfetto trace; returns the file's path (onnxruntime's call)."""
        import time

        if self.profiling is None:
            raise AnychipError("end_profiling: load with enable_profiling=True to profile")
        if self._last_feeds is None:
            raise AnychipError("end_profiling: the session has not run yet; nothing to profile")
        path = f"{self.profiling}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
        return str(self.profile(self._last_feeds).save_trace(path))

    def profile(self, feeds: Mapping[str, Any] | None = None, runs: int = 1) -> Profile:
        """Per node, partition and copy times over ``runs`` runs (core/report/profile.py)."""
        return profile_session(self, random_feeds(self) if feeds is None else feeds, runs)

    def run(
        self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], run_options: Any = None,
        *, output_device: str | None = None,
    ) -> list[Any]:  # fmt: skip
        """Run the model on ``feeds`` (input name -> numpy array, or a device array that stays
        on its device); numpy outputs, or ``output_device``'s arrays (core/api/dlpack.py). Raises
        ``InputError`` for a bad feed, ``KernelError`` naming the node when a kernel fails."""
        # a dict of numpy arrays as declared, host outputs: checked in one pass (feeds.py)
        arrays = self._feeds.quick(feeds) if output_device is None else None
        if arrays is None:
            if device_values.involved(feeds):  # DeviceValue feeds stay on their device
                return guarded_run(
                    lambda: device_values.run_values(self, output_names, feeds, {}), run_options
                )
            if dlpack.involved(feeds, output_device):
                return guarded_run(
                    lambda: dlpack.run(self, output_names, feeds, output_device), run_options
                )
            arrays = self._feeds.check(feeds)
        wanted = self._feeds.select(output_names)
        if run_options is None:  # guarded_run's own first test, without building a closure
            with self._lock:
                outs = run_request(self, arrays)  # feedback, failover (core/run/failover.py)
        else:

            def request() -> list[Any]:
                with self._lock:
                    return run_request(self, arrays)

            outs = guarded_run(request, run_options)  # terminate, run_tag (core/api/ort_api.py)
        if self.profiling is not None:
            self._last_feeds = dict(feeds)
        return [detach(outs[i], feeds) for i in wanted]

    def run_async(
        self, output_names: Sequence[str] | None, feeds: Mapping[str, Any],
        callback: Any = None, user_data: Any = None, run_options: Any = None,
    ) -> Any:  # fmt: skip
        """``run`` on the session's worker threads: a ``concurrent.futures.Future`` of the
        outputs; ``callback(outputs, user_data, error)`` when done, as onnxruntime calls it."""
        if self._async is None:
            self._async = AsyncRunner(self.run)
        return self._async.submit(output_names, feeds, callback, user_data, run_options)

    def io_binding(self) -> IOBinding:
        """Inputs and outputs bound across runs (onnxruntime's ``io_binding()``)."""
        return IOBinding(self)

    def run_with_iobinding(self, binding: IOBinding, run_options: Any = None) -> None:
        """One run of ``binding``'s inputs into its bound outputs."""
        binding.run(run_options)

    def export_compiled(self, path: str) -> str:
        """This session as one file: the model, the placement and every graph-mode
        partition's compiled bytes (``anychip.load_compiled`` loads it; core/api/export.py)."""
        from anychip.core.api.export import export_compiled

        with self._lock:
            return str(export_compiled(self, path, self._disk, self._disk_mark))

    def get_modelmeta(self) -> ModelMetadata:
        """The model file's producer, graph name, domain, description, version, metadata."""
        return model_metadata(self.model)

    def close(self) -> None:
        """Release the session's device memory now (asynchronous requests finished first)."""
        if self._async is not None:
            self._async.close()
        super().close()

    def replan(self) -> None:
        """Place and compile again on the devices not in ``unhealthy`` (runs mark failing ones)."""
        check_open(self)  # a closed session has nothing to place (AttributeError before)
        if self._compile_with is None:
            raise AnychipError("a session on one device has nothing to re-place onto")
        keep = [d for d in self.devices if d not in self.unhealthy]
        factors = self.compiled.costs.factors if self.compiled.costs else {}
        with self._lock:
            old = self.compiled
            self._use(self._compile_with(factors, devices=keep))
            old.close()  # its graph-mode executables go back to their devices now

    def _repr_html_(self) -> str | None:
        """Jupyter's view: the placement graph and report (``viz/notebook.py``, found through
        ``core/report/render.py``); None (the text) where viz is not there."""
        from anychip.core.report.render import find

        fn = find("session", "html")
        return None if fn is None else str(fn(self))

    def __repr__(self) -> str:
        return (
            f"<anychip.Session devices={self.devices} inputs={[i.name for i in self.inputs]}"
            f" outputs={self._feeds.output_names}>"
        )


def load(
    model: Any,
    devices: Sequence[str] | str | None = None,
    options: SessionOptions | None = None,
    **keywords: Any,
) -> Session:
    """Compile a model for a set of devices; returns a ``Session`` (``sess.run(None, feeds)``).

    Args:
        model: a path to an ``.onnx`` file, its bytes, an ``onnx.ModelProto`` or an
            ``anychip.ir.Model``.
        devices: device names in priority order (``["npu", "cpu"]`` or ``"npu,cpu"``);
            default ``ANYCHIP_DEVICES``, else every available device, cpu last. The cpu is
            added last as the fallback unless ``strict=True`` (``devices=["npu"]`` is a
            session on npu and cpu; ``Session.devices`` lists them; logged at INFO level).
        options: a ``SessionOptions`` (every field documented there); default its defaults.
        keywords: any ``SessionOptions`` field by name, applied over ``options``
            (``load(m, strict=True)``); an unknown name is an ``AnychipError``.
    """
    if options is not None and not isinstance(options, SessionOptions):
        raise AnychipError(
            f"options must be an anychip.SessionOptions, got {type(options).__name__}"
        )
    opt = (options or SessionOptions()).updated(**keywords) if keywords else options
    opt = opt or SessionOptions()
    names = resolve_devices(devices, strict=opt.strict)  # imports the plugins these need
    registry = get_registry(names)
    opts = PlacementOptions(
        opt.placement, opt.strict, opt.max_copies, opt.cost_model, opt.max_copy_bytes
    )
    opts.calibration = resolve_calibration_mode(opt.calibration)
    opts.explore_budget = float(opt.explore_budget)
    opts.remember = opt.remember_placement
    opts.failover = opt.failover and not opt.bring_up  # bring-up hides nothing
    set_policy(opts, opt.placement_policy)
    copts = CompileOptions(
        opt.plan_cache_size,
        opt.optimizes(),  # optimize, or onnxruntime's graph_optimization_level
        opt.check_kernels or opt.bring_up,
        opt.compile_cache_size,
        False if opt.bring_up else opt.background_compile,  # the device runs from the start
        bring_up=opt.bring_up,
        compile_timeout=opt.compile_timeout,
    )
    with gc_paused(), task("loading the model"):  # gcpause: a load's objects all live on
        if not isinstance(model, Model):
            model = import_model(
                model,
                custom_schemas=registry.schemas,
                max_bytes=opt.max_load_bytes,
                free_dims=opt.free_dimension_overrides,
            )
        elif opt.free_dimension_overrides:
            raise AnychipError(
                "free_dimension_overrides apply when an ONNX model is imported: pass its "
                "path, bytes or ModelProto, not an anychip.ir.Model"
            )
        session = Session(model, names, opts, _device_options(opt, names), copts)
        session.profiling = opt.profile_file_prefix if opt.enable_profiling else None
        session.export_options = _export_options(opt)
        return session


def _export_options(opt: SessionOptions) -> dict[str, Any]:
    """The options an exported archive keeps: those that decide the nodes and their code
    (free dimensions are fixed in the exported model already)."""
    import json

    kept = {
        "optimize": opt.optimizes(),
        "strict": opt.strict,
        "device_options": {k: dict(v) for k, v in (opt.device_options or {}).items()},
        "intra_op_num_threads": opt.intra_op_num_threads,
        "precision": opt.precision,
    }
    try:
        json.dumps(kept)
    except TypeError:  # an option that is no JSON value: said at export, not here
        kept["device_options"] = None
    return kept


def _device_options(opt: SessionOptions, names: list[str]) -> Mapping[str, Mapping[str, Any]]:
    """``device_options`` with ``intra_op_num_threads`` given to the cpu as its ``threads``
    and the precision policy as its ``precision`` (the cpu's own settings, if any, win)."""
    given = {str(k).lower(): dict(v) for k, v in (opt.device_options or {}).items()}
    if opt.intra_op_num_threads and "cpu" in names:
        given.setdefault("cpu", {}).setdefault("threads", opt.intra_op_num_threads)
    precision = resolve_precision(opt.precision)
    if precision != "fp32" and "cpu" in names:
        given.setdefault("cpu", {}).setdefault("precision", precision)
    return given


def _open_probe(model: Any, device: str) -> Session:
    """A calibration probe's session: the model on ``device`` alone, placed as declared."""
    # a static-shape device compiles before the first run: in the background its runs would
    # go to the host meanwhile, and the host's time be taken for the device's
    return load(
        model,
        devices=[device],
        cost_model=False,
        check_kernels=False,
        calibration="off",
        background_compile=False,
    )


set_probe_opener(_open_probe)
