"""Batch inference on Ray Data: one anychip session per actor (``pip install anychip[ray]``).

``Dataset.map_batches`` with a callable class is Ray's way to run a model over a large data set
on a cluster: one model instance per actor, batches streamed to the actors, GPUs or other
accelerators assigned per actor. ``Predictor`` is that class; ``BatchInference`` prepares the
job in the driver (the model checked before any actor starts, the resources each actor asks
for, the actor pool) and collects what each actor reports::

    import ray
    from anychip.integrations.ray import BatchInference

    job = BatchInference("model.onnx", devices=["npu", "cpu"], concurrency=2, threads=1)
    ds = ray.data.read_parquet("images/")
    with job.errors():                    # an actor's AnychipError, not a Ray stack trace
        job.map(ds).write_parquet("predictions/")
    print(job.summary())                  # per actor: node, placement, rows, rows/s

Resources follow the devices: ``cuda`` asks Ray for a GPU, any other accelerator for the
custom resource ``anychip_<kind>`` (start a node with ``ray start --resources='{"anychip_npu":
1}'`` where the chip is), and ``threads`` CPUs per actor, each actor's BLAS pool set to that
many threads, so two one-thread actors share two cores without oversubscribing them.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anychip.errors import AnychipError, ModelError
from anychip.integrations import _ray_support as support
from anychip.integrations._columns import ColumnMap

__all__ = [
    "ActorLoadError",
    "ActorStats",
    "BatchError",
    "BatchInference",
    "Predictor",
    "resources_for",
]


#: Batches after which an actor's placement is read again (the feedback's trials are over).
_PLACEMENT_BATCHES = 4


class BatchError(AnychipError):
    """One batch failed on one actor; the message names the batch, its rows and the actor."""


class ActorLoadError(ModelError):
    """An actor could not load the model on its node; the message names the actor and node."""


def resources_for(devices: Sequence[str] | str | None, threads: int = 1) -> dict[str, Any]:
    """The ``map_batches`` resource arguments for one actor using ``devices``.

    ``num_cpus`` is ``threads``; a ``cuda`` device adds ``num_gpus=1``; every other accelerator
    kind adds the custom resource ``anychip_<kind>: 1`` (``npu:0`` -> ``anychip_npu``), which a
    cluster's nodes that have the chip declare (``ray start --resources=...``). ``cpu`` and
    ``None`` (each actor uses what its node has) ask for CPUs only.
    """
    if isinstance(devices, str):
        devices = [d.strip() for d in devices.split(",") if d.strip()]
    out: dict[str, Any] = {"num_cpus": threads}
    custom: dict[str, float] = {}
    for device in devices or ():
        kind = device.split(":")[0].strip().lower()
        if kind == "cuda":
            out["num_gpus"] = 1
        elif kind != "cpu":
            custom[f"anychip_{kind}"] = 1
    if custom:
        out["resources"] = custom
    return out


@dataclass
class ActorStats:
    """What one actor did: where it ran, where its model's nodes were placed, its timing."""

    actor: str
    host: str
    node: str
    pid: int
    devices: list[str]
    placement: dict[str, int]
    load_seconds: float
    blas_threads: int = 0  # the size of the actor's BLAS pool after its limit (threadpoolctl)
    batches: int = 0
    rows: int = 0
    run_seconds: float = 0.0  # inside Session.run
    busy_seconds: float = 0.0  # the whole batch: columns, runs and outputs
    started: float = 0.0  # wall clock (time.time) when the first batch came in
    finished: float = 0.0  # wall clock when the latest batch went out
    errors: list[str] = field(default_factory=list)

    @property
    def rows_per_second(self) -> float:
        """Rows over the time spent on batches (not the time waiting for them)."""
        return self.rows / self.busy_seconds if self.busy_seconds else 0.0


class Predictor:
    """The callable class for ``Dataset.map_batches``: one anychip session per actor.

    Each actor loads the model once (``__init__``), then maps every numpy batch: the input
    columns become the model's feeds (``inputs={model_input: column}``, or one column's name
    for a one-input model; default the column of the same name, or the only column), the
    outputs become columns (``outputs={output: column}``, default every output under its own
    name), and ``keep_columns`` (True, False or names) pass through. A failing batch raises
    ``BatchError`` naming the batch, its rows (and the ``id_column`` values) and the actor.
    ``stats()`` returns the actor's ``ActorStats``; with ``stats_sink`` (a named actor
    ``BatchInference`` creates) each batch is reported.
    """

    def __init__(
        self,
        model: str | bytes,
        devices: Sequence[str] | str | None = None,
        *,
        inputs: Mapping[str, str] | str | None = None,
        outputs: Mapping[str, str] | Sequence[str] | None = None,
        keep_columns: bool | Sequence[str] = True,
        id_column: str | None = None,
        threads: int | None = None,
        load_options: Mapping[str, Any] | None = None,
        stats_sink: str | None = None,
    ) -> None:
        self._blas_threads = support.limit_threads(threads)
        self._id_column = id_column
        self._sink = support.find_sink(stats_sink)
        self._where = support.whereabouts()
        start = time.perf_counter()
        model = support.fetch_model(model)  # BatchInference ships the bytes once, by reference
        try:
            import anychip

            self._session = anychip.load(model, devices, **dict(load_options or {}))
            self._columns = ColumnMap(self._session, inputs, outputs, keep_columns)
        except AnychipError as e:
            message = (
                f"actor {self._where['actor']} on {self._where['host']} (pid "
                f"{self._where['pid']}) could not load the model: {type(e).__name__}: {e}"
            )
            support.tell(self._sink, "ActorLoadError", message)
            raise ActorLoadError(message) from e
        self._stats = ActorStats(
            devices=list(self._session.devices),
            placement=self._session.placement().by_device(),
            load_seconds=time.perf_counter() - start,
            blas_threads=self._blas_threads,
            **self._where,
        )
        self._report({})

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model over one batch (``dict[column, ndarray]``), rows in, rows out."""
        index = self._stats.batches
        wall = time.time()
        start = time.perf_counter()
        rows = len(next(iter(batch.values()))) if batch else 0
        try:
            feeds, rows = self._columns.feeds(batch)
            t_run = time.perf_counter()
            outputs = self._columns.run(self._session, feeds, rows)
            run_seconds = time.perf_counter() - t_run
            result = self._columns.result(batch, outputs, rows)
        except Exception as e:
            message = self._describe_failure(index, rows, batch, e)
            self._stats.errors.append(message)
            self._report({"errors": [message]})
            support.tell(self._sink, "BatchError", message)
            raise BatchError(message) from e
        busy = time.perf_counter() - start
        self._stats.batches += 1
        self._stats.rows += rows
        self._stats.run_seconds += run_seconds
        self._stats.busy_seconds += busy
        self._stats.started = self._stats.started or wall
        self._stats.finished = wall + busy
        if index < _PLACEMENT_BATCHES:  # the session's feedback may re-place its first runs
            self._stats.placement = self._session.placement().by_device()
        self._report(
            {
                "batches": 1,
                "rows": rows,
                "run_seconds": run_seconds,
                "busy_seconds": busy,
                "started": self._stats.started,
                "finished": self._stats.finished,
                "placement": self._stats.placement,
            }
        )
        return result

    def stats(self) -> ActorStats:
        """This actor's placement and timing so far."""
        return self._stats

    def _describe_failure(
        self, index: int, rows: int, batch: Mapping[str, Any], e: Exception
    ) -> str:
        ids = ""
        if self._id_column and self._id_column in batch and rows:
            column = batch[self._id_column]
            first, last = np.asarray(column[0]).tolist(), np.asarray(column[-1]).tolist()
            ids = f", {self._id_column} {first!r}..{last!r}"
        return (
            f"batch {index} of actor {self._stats.actor} on {self._stats.host} (pid "
            f"{self._stats.pid}; {rows} rows{ids}) failed: {type(e).__name__}: {e}"
        )

    def _report(self, delta: dict[str, Any]) -> None:
        if self._sink is not None:
            self._sink.record.remote(self._stats.actor, self._stats if not delta else None, delta)


class BatchInference:
    """One batch-inference job: the model checked in the driver, the actors' arguments, stats.

    Args:
        model: a path to an ``.onnx`` file (read in the driver and shipped as bytes, so the
            other nodes need not see the file; ``ship_bytes=False`` passes the path, which
            every node must then read, as a model with external data needs), its bytes, or
            an ``onnx.ModelProto``.
        devices: each actor's devices (``["npu", "cpu"]``); None: what each node has.
        concurrency: the number of actors (Ray's fixed-size ``ActorPoolStrategy``).
        threads: CPU threads per actor: the CPUs it asks Ray for and its BLAS pool's size.
        batch_size: rows per batch handed to an actor.
        validate: ``"load"`` (default) compiles the model in the driver before the pipeline
            starts (on ``devices`` where the driver has them all, else on the cpu), so a bad
            model fails here with its anychip error; ``"import"`` only imports and checks
            it; ``None`` skips the check.
        check_cluster: fail before starting when no node declares a resource the actors need.
        Other arguments go to ``Predictor``; ``load_options`` to ``anychip.load``.
    """

    def __init__(
        self,
        model: Any,
        devices: Sequence[str] | str | None = None,
        *,
        concurrency: int = 1,
        threads: int = 1,
        batch_size: int | None = 256,
        inputs: Mapping[str, str] | str | None = None,
        outputs: Mapping[str, str] | Sequence[str] | None = None,
        keep_columns: bool | Sequence[str] = True,
        id_column: str | None = None,
        load_options: Mapping[str, Any] | None = None,
        validate: str | None = "load",
        ship_bytes: bool = True,
        check_cluster: bool = True,
        collect_stats: bool = True,
    ) -> None:
        if concurrency < 1 or threads < 1:
            raise AnychipError(
                f"concurrency and threads must be >= 1 (got {concurrency}, {threads})"
            )
        self.model = support.model_payload(model, ship_bytes)
        self.devices = devices
        self.concurrency, self.threads, self.batch_size = concurrency, threads, batch_size
        self.load_options = dict(load_options or {})
        self.check_cluster = check_cluster
        self.predictor_kwargs: dict[str, Any] = {
            "devices": devices,
            "inputs": inputs,
            "outputs": outputs,
            "keep_columns": keep_columns,
            "id_column": id_column,
            "threads": threads,
            "load_options": self.load_options,
        }
        if validate is not None:
            support.validate(self.model, devices, self.load_options, validate)
        self._collect = collect_stats
        self._sink: Any = None
        self._ref: Any = None  # the model bytes in Ray's object store, once put there

    def _model_ref(self) -> Any:
        """The model for the actors: bytes go to Ray's object store once (``ray.put``) and
        every actor reads them from there; otherwise each actor's constructor arguments carry
        a copy (Ray warned of a 372 MiB UDF for the light ResNet-50)."""
        if not isinstance(self.model, bytes):
            return self.model
        if self._ref is None:
            self._ref = support.import_ray().put(self.model)
        return self._ref

    def map_batches_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``ds.map_batches(Predictor, **kwargs)`` for this job."""
        ray = support.import_ray()

        kwargs = {**self.predictor_kwargs, "stats_sink": self._sink_name()}
        env = {var: str(self.threads) for var in support.THREAD_VARS}
        return {
            "compute": ray.data.ActorPoolStrategy(size=self.concurrency),
            "batch_size": self.batch_size,
            "batch_format": "numpy",
            "fn_constructor_args": (self._model_ref(),),
            "fn_constructor_kwargs": kwargs,
            "runtime_env": {"env_vars": env},
            **resources_for(self.devices, self.threads),
        }

    def map(self, ds: Any) -> Any:
        """``ds`` with the model's outputs as columns (lazy, like every Ray Data transform)."""
        if self.check_cluster:
            support.check_cluster(resources_for(self.devices, self.threads), self.concurrency)
        return ds.map_batches(Predictor, **self.map_batches_kwargs())

    def run(self, ds: Any) -> Any:
        """``map(ds)`` executed now (``materialize``), an actor's anychip error re-raised."""
        with self.errors():
            return self.map(ds).materialize()

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Re-raise an anychip error from an actor as itself, not inside Ray's exceptions."""
        try:
            yield
        except AnychipError:
            raise
        except Exception as e:
            found = self._first_failure(e)
            if found is None:
                raise
            raise found from None

    def _first_failure(self, e: BaseException) -> AnychipError | None:
        """The first failure an actor reported, else one found in the exception or its text."""
        kinds = {"BatchError": BatchError, "ActorLoadError": ActorLoadError}
        if self._sink is not None:
            ray = support.import_ray()

            failures = ray.get(self._sink.failures.remote())
            if failures:
                kind, message = failures[0]
                return kinds[kind](message)
        found = support.anychip_cause(e)
        if found is not None:
            return found
        # Ray Data re-raises a worker's exception as text: find the line our error wrote.
        match = re.search(r"(BatchError|ActorLoadError): (.*)", str(e))
        return kinds[match.group(1)](match.group(2)) if match else None

    def stats(self) -> list[ActorStats]:
        """Every actor's ``ActorStats`` so far (empty without ``collect_stats``)."""
        if self._sink is None:
            return []
        ray = support.import_ray()

        return ray.get(self._sink.stats.remote())

    def summary(self) -> str:
        """One line per actor: host, pid, placement, load time, batches, rows and rows/s."""
        lines = []
        for s in self.stats():
            lines.append(
                f"actor {s.actor[:12]} {s.host} pid {s.pid} devices {','.join(s.devices)} "
                f"nodes {s.placement} BLAS threads {s.blas_threads} load {s.load_seconds:.2f}s: "
                f"{s.batches} batches, "
                f"{s.rows} rows, {s.rows_per_second:.1f} rows/s busy"
                + (f", {len(s.errors)} failed" if s.errors else "")
            )
        return "\n".join(lines) or "no actor reported"

    def _sink_name(self) -> str | None:
        if not self._collect:
            return None
        if self._sink is None:
            ray = support.import_ray()

            self._sink_id = f"anychip-stats-{uuid.uuid4().hex[:12]}"
            self._sink = (
                ray.remote(num_cpus=0)(support.StatsSink).options(name=self._sink_id).remote()
            )
        return self._sink_id
