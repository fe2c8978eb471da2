"""onnxruntime's run-side interfaces on an anychip ``Session``: run options, model metadata,
an IO binding, asynchronous runs.

* ``RunOptions`` (or onnxruntime's own ``RunOptions``, read by attribute): ``terminate``
  cancels the requests of a session that see it set: checked before a run starts, between
  its steps and nodes while it runs (``core/run/cancel.py``; set it from another thread) and
  when it ends. A run that finds it set raises ``RunTerminatedError`` and returns nothing; the
  session serves the next request as usual. ``run_tag`` names the request in the ``anychip``
  log. Anything else given as ``run_options`` is an ``AnychipError``, never ignored.
* ``ModelMetadata`` (``Session.get_modelmeta()``): producer, graph name, domain, description,
  version, custom metadata, as onnxruntime's ``ModelMetadata`` has them.
* ``IOBinding`` (``Session.io_binding()``): inputs bound by name (a name the model lacks is
  refused at once) and kept across runs (each run checks them as ``run`` does: its fast path
  for feeds of the declared dtype and rank), outputs written into the same arrays run after
  run (a bound output array, or one the binding allocates on its first run), or kept on a
  device (``bind_output(name, "xpu")``: a ``DeviceValue``, onnxruntime's ``OrtValue``, that
  a later run takes as an input without a copy: ``core/api/device_values.py``);
  ``run_with_iobinding`` runs it. A device array with ``__dlpack__`` is run through the DLPack
  path as ``Session.run`` does (``core/api/dlpack.py``).
* ``run_async``: a ``concurrent.futures.Future`` per request, run on a small thread pool of the
  session's (requests queue there; a session's runs are serialised by its lock, so several in
  flight overlap only their host work: several sessions give parallel runs).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.api import device_values
from anychip.core.api.device_values import DeviceValue
from anychip.core.run.cancel import watching
from anychip.errors import AnychipError, InputError, RunTerminatedError

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["RunOptions", "RunTerminatedError", "ModelMetadata", "IOBinding", "AsyncRunner"]

log = logging.getLogger("anychip")


@dataclass
class RunOptions:
    """Per-request options (onnxruntime's ``RunOptions``): ``terminate`` (set it from another
    thread to cancel the requests that carry these options), ``run_tag`` (the request's name in
    the log), ``log_severity_level`` (0 verbose .. 4 fatal: the tag's line is logged at INFO
    when it is 0-1, else not)."""

    terminate: bool = False
    run_tag: str = ""
    log_severity_level: int = 2


def _run_options(options: Any) -> RunOptions | None:
    """``options`` as ``RunOptions``: None, ours, or an object with onnxruntime's attributes."""
    if options is None or isinstance(options, RunOptions):
        return options
    kind = type(options)  # its class: reading the instance's terminate would use it up
    if hasattr(kind, "terminate") and hasattr(kind, "log_severity_level"):
        return _Borrowed(options)  # type: ignore[return-value]
    raise AnychipError(
        f"run_options must be an anychip RunOptions (or onnxruntime's), got "
        f"{type(options).__name__}: anychip.core.api.ort_api.RunOptions(terminate=..., run_tag=...)"
    )


class _Borrowed:
    """onnxruntime's ``RunOptions`` read live (its ``terminate`` may be set during the run)."""

    def __init__(self, options: Any) -> None:
        self._o = options

    @property
    def terminate(self) -> bool:
        return bool(self._o.terminate)

    @property
    def run_tag(self) -> str:
        return str(getattr(self._o, "logid", "") or getattr(self._o, "run_tag", "") or "")

    @property
    def log_severity_level(self) -> int:
        return int(self._o.log_severity_level)


def guarded_run(run: Callable[[], list[Any]], options: Any) -> list[Any]:
    """``run()`` under ``options``: refused when terminate is set before it, stopped between
    steps and nodes when it is set while it runs, its outputs dropped when it was set by the
    end, the tag logged."""
    opts = _run_options(options)
    if opts is None:
        return run()
    tag = opts.run_tag or "request"
    if opts.terminate:
        raise RunTerminatedError(f"{tag}: terminated (RunOptions.terminate) before it started")
    if opts.log_severity_level <= 1:
        log.info("anychip: run %s", tag)
    with watching(opts, tag):
        outs = run()
    if opts.terminate:
        raise RunTerminatedError(
            f"{tag}: terminated (RunOptions.terminate) while running; its outputs are dropped"
        )
    return outs


@dataclass
class ModelMetadata:
    """What onnxruntime's ``InferenceSession.get_modelmeta()`` returns, from the model file."""

    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


def model_metadata(model: Any) -> ModelMetadata:
    """``ModelMetadata`` of an ``ir.Model`` (the fields its importer kept)."""
    return ModelMetadata(
        producer_name=str(model.producer_name or ""),
        graph_name=str(model.graph.name or ""),
        domain=str(model.domain or ""),
        description=str(model.doc or ""),
        graph_description=str(model.graph.doc or ""),
        version=int(model.model_version or 0),
        custom_metadata_map=dict(model.metadata or {}),
    )


class IOBinding:
    """Inputs and outputs bound to a session across runs (onnxruntime's ``IOBinding``).

    ``bind_input(name, array)`` keeps the array (or ``DeviceValue``) for every run;
    ``bind_output(name, array=None)`` binds an output to an array the runs write into (None:
    allocated on the first run, then reused), ``bind_output(name, "xpu")`` keeps it on that
    device of the session (a new ``DeviceValue`` each run, the last one's tensor given back
    when nothing else holds it);
    ``session.run_with_iobinding(binding)`` runs; ``get_outputs()`` returns the bound arrays
    (the same objects every run) and device values, ``copy_outputs_to_cpu()`` host copies of
    them.
    """

    def __init__(self, session: Any) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, Any] = {}
        self._devices: dict[str, str] = {}

    def bind_input(self, name: str, array: Any) -> None:
        known = [i.name for i in self._session.inputs]
        if name not in known:
            raise InputError(f"bind_input: the model has no input {name!r} (inputs: {known})")
        self._inputs[name] = array

    def bind_output(self, name: str, array: np.ndarray | str | None = None) -> None:
        known = [o.name for o in self._session.outputs]
        if name not in known:
            raise InputError(f"bind_output: the model has no output {name!r} (outputs: {known})")
        self._devices.pop(name, None)
        if isinstance(array, str):
            device = array.lower()
            if device not in self._session.devices:
                raise InputError(
                    f"bind_output {name!r}: {array!r} is not among the session's devices "
                    f"{self._session.devices}"
                )
            self._devices[name] = device
            self._outputs[name] = None
            return
        if array is not None and not isinstance(array, np.ndarray):
            raise InputError(
                f"bind_output {name!r}: a numpy array, a device name or None, not {type(array)}"
            )
        self._outputs[name] = array

    def clear_binding_inputs(self) -> None:
        self._inputs = {}

    def clear_binding_outputs(self) -> None:
        self._outputs, self._devices = {}, {}

    def run(self, run_options: Any = None) -> None:
        """One run on the bound inputs, its outputs written into the bound arrays (or kept on
        their devices)."""
        names = list(self._outputs) or [o.name for o in self._session.outputs]
        if self._devices or device_values.involved(self._inputs):
            session, inputs, devices = self._session, self._inputs, self._devices
            outs = guarded_run(
                lambda: device_values.run_values(session, names, inputs, devices), run_options
            )
        else:
            outs = self._session.run(names, self._inputs, run_options)
        for name, out in zip(names, outs):
            if name in self._devices:
                self._outputs[name] = out  # the last run's value goes when nothing holds it
                continue
            held = self._outputs.get(name)
            out = np.asarray(out)
            if held is None or held.shape != out.shape or held.dtype != out.dtype:
                if held is not None and name in self._outputs:
                    raise InputError(
                        f"bound output {name!r} is {held.dtype}{list(held.shape)}; this run "
                        f"gave {out.dtype}{list(out.shape)}: bind an array of that shape"
                    )
                self._outputs[name] = out.copy()
            else:
                np.copyto(held, out)

    def get_outputs(self) -> list[Any]:
        """The bound outputs: numpy arrays, and ``DeviceValue`` for those kept on a device."""
        return [a for a in self._outputs.values() if a is not None]

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [a.numpy() if isinstance(a, DeviceValue) else a.copy() for a in self.get_outputs()]


class AsyncRunner:
    """The session's requests run on ``workers`` threads, each returned as a ``Future``."""

    def __init__(self, run: Callable[..., list[Any]], workers: int = 2) -> None:
        self._run, self._workers = run, workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(
        self,
        output_names: Sequence[str] | None,
        feeds: Mapping[str, Any],
        callback: Callable[[list[Any] | None, Any, str], None] | None = None,
        user_data: Any = None,
        run_options: Any = None,
    ) -> Future:
        from concurrent.futures import ThreadPoolExecutor  # with the first run_async only

        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="anychip-run")
            future = self._pool.submit(self._run, output_names, dict(feeds), run_options)
        if callback is not None:  # onnxruntime's run_async: callback(outputs, user_data, error)

            def done(f: Future) -> None:
                err = f.exception()
                callback(None if err else f.result(), user_data, "" if err is None else str(err))

            future.add_done_callback(done)
        return future

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
