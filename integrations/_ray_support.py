"""The driver's and the actors' plumbing behind ``anychip.integrations.ray`` (private).

The stats sink (a named actor the predictors report to), the actors' thread limits and
whereabouts, and the driver's checks: the model loaded before the pipeline starts, the
cluster's resources, an actor's error found behind Ray's exceptions.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import TYPE_CHECKING, Any

from anychip.errors import AnychipError, ModelError, warn_caller

if TYPE_CHECKING:
    from anychip.integrations.ray import ActorStats

__all__: list[str] = []

#: Environment variables that size a BLAS/OpenMP pool when a worker process starts.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "ANYCHIP_XPU_THREADS")


def import_ray() -> Any:
    """``ray`` with Ray Data, or an ``AnychipError`` saying which extra to install."""
    try:
        import ray
        import ray.data
    except ImportError as e:
        raise AnychipError(
            f"anychip.integrations.ray needs Ray Data ({e}); pip install 'anychip[ray]'"
        ) from e
    return ray


class StatsSink:
    """A named actor the predictors report to; the driver reads it (``BatchInference.stats``)."""

    def __init__(self) -> None:
        self._stats: dict[str, ActorStats] = {}
        self._failures: list[tuple[str, str]] = []

    def failed(self, kind: str, message: str) -> None:
        self._failures.append((kind, message))

    def failures(self) -> list[tuple[str, str]]:
        """The failures reported since the last call (a job may run again after one)."""
        out, self._failures = self._failures, []
        return out

    def record(self, actor: str, first: ActorStats | None, delta: dict[str, Any]) -> None:
        if first is not None:
            self._stats[actor] = first
            return
        s = self._stats[actor]
        for key, value in delta.items():
            if key in ("started", "finished", "placement"):
                setattr(s, key, value)
            else:
                setattr(s, key, getattr(s, key) + value)

    def stats(self) -> list[ActorStats]:
        return list(self._stats.values())


def limit_threads(threads: int | None) -> int:
    """Cap this process's BLAS/OpenMP pools at ``threads``; returns the largest pool's size."""
    from threadpoolctl import threadpool_info, threadpool_limits

    if not threads:
        return max((p["num_threads"] for p in threadpool_info()), default=0)

    # The pools are sized at the process's first BLAS call from the environment (set by the
    # actor's runtime_env); this also caps a pool a library already started.
    threadpool_limits(threads)
    for var in THREAD_VARS:
        os.environ[var] = str(threads)
    with contextlib.suppress(Exception):  # the simulated XPU's own pool, when it is loaded
        from anychip.backends.xpu_stub.driver import set_num_threads

        set_num_threads(threads)
    return max((p["num_threads"] for p in threadpool_info()), default=0)


def whereabouts() -> dict[str, Any]:
    ray = import_ray()

    ctx = ray.get_runtime_context()
    actor = ctx.get_actor_id() if ray.is_initialized() else None
    node = ctx.get_node_id() if ray.is_initialized() else ""
    return {
        "actor": actor or f"local-{os.getpid()}",
        "host": socket.gethostname(),
        "node": node or "",
        "pid": os.getpid(),
    }


def tell(sink: Any, kind: str, message: str) -> None:
    """Report a failure and wait for it to land, so the driver finds it when Ray raises."""
    if sink is not None:
        ray = import_ray()

        with contextlib.suppress(Exception):
            ray.get(sink.failed.remote(kind, message), timeout=10)


def find_sink(name: str | None) -> Any:
    if name is None:
        return None
    ray = import_ray()

    return ray.get_actor(name)


def model_payload(model: Any, ship_bytes: bool) -> str | bytes:
    if isinstance(model, bytes | bytearray):
        return bytes(model)
    if isinstance(model, str | os.PathLike):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ModelError(f"model file {path!r} does not exist")
        if not ship_bytes:
            return os.path.abspath(path)
        with open(path, "rb") as f:
            return f.read()
    if hasattr(model, "SerializeToString"):
        return model.SerializeToString()
    raise ModelError(
        f"BatchInference takes a model path, its bytes or an onnx.ModelProto, not "
        f"{type(model).__name__} (an anychip.ir.Model: export it with anychip.ir.onnx)"
    )


def fetch_model(model: Any) -> Any:
    """The model an actor was given: a Ray object reference is read from the object store."""
    if type(model).__name__ == "ObjectRef":
        return import_ray().get(model)
    return model


def validate(model: str | bytes, devices: Any, options: dict[str, Any], how: str) -> None:
    import anychip
    from anychip.ir.onnx import import_model

    if how == "import":
        import_model(model)
        return
    if how != "load":
        raise AnychipError(f"validate must be 'load', 'import' or None, not {how!r}")
    here = {d.name for d in anychip.devices() if d.available}
    wanted = [devices] if isinstance(devices, str) else list(devices or [])
    wanted = [d.strip().lower() for w in wanted for d in w.split(",") if d.strip()]
    if wanted and set(wanted) <= here:
        session = anychip.load(model, wanted, **options)
    else:  # the driver may lack the workers' chips: the cpu runs every op anychip knows
        cpu_options = {k: v for k, v in options.items() if k not in ("placement", "strict")}
        session = anychip.load(model, ["cpu"], **cpu_options)
    session.close()


def check_cluster(resources: dict[str, Any], actors: int) -> None:
    ray = import_ray()

    if not ray.is_initialized():
        return  # Ray Data starts a local cluster on first use; it has no custom resources
    total = ray.cluster_resources()
    if total.get("CPU", 0) < actors * resources["num_cpus"] + 1:
        warn_caller(
            f"the {actors} actors ask for {actors * resources['num_cpus']} of the cluster's "
            f"{total.get('CPU', 0):g} CPUs: Ray Data's read and write tasks need one too, and a "
            "pipeline that reads files waits forever without it; use fewer actors or threads, "
            "or declare one more CPU (ray.init(num_cpus=...)/ray start --num-cpus)"
        )
    need = dict(resources.get("resources", {}))
    if resources.get("num_gpus"):
        need["GPU"] = resources["num_gpus"]
    for name, amount in need.items():
        if total.get(name, 0) < amount:
            raise AnychipError(
                f"no node of this Ray cluster has the resource {name!r} the actors ask for "
                f"(cluster: {dict(total)}); start the nodes that have the chip with "
                f"`ray start --resources='{{\"{name}\": 1}}'` (or ray.init(resources=...) "
                "locally), or pass check_cluster=False on an autoscaling cluster"
            )


def anychip_cause(e: BaseException) -> AnychipError | None:
    seen: set[int] = set()
    stack: list[BaseException | None] = [e]
    while stack:
        exc = stack.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, AnychipError):
            return exc
        stack += [exc.__cause__, exc.__context__, getattr(exc, "cause", None)]
    return None
