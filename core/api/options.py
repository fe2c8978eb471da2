"""``SessionOptions``: every setting of ``anychip.load`` in one object (onnxruntime's shape).

``anychip.load(model, devices, options=SessionOptions(...))`` and the keyword form
``anychip.load(model, devices, strict=True)`` are the same call: the keywords are a
convenience that fills a copy of ``options`` (or of the defaults). An unknown keyword or a
value of the wrong kind is an ``AnychipError`` naming it and the known ones.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from anychip.core.plugin.budget import check_timeout, default_timeout
from anychip.errors import AnychipError

__all__ = ["PRECISIONS", "SessionOptions", "resolve_precision"]

#: The precision policies: float32 everywhere, or bfloat16 products on the CPU.
PRECISIONS = ("fp32", "bf16")

#: onnxruntime's optimization levels (``GraphOptimizationLevel``) -> whether anychip optimizes.
_LEVELS: dict[str | int, bool] = {
    "disable_all": False, 0: False, "basic": True, 1: True, "extended": True, 2: True,
    "all": True, "layout": True, 99: True,
}  # fmt: skip


@dataclass
class SessionOptions:
    """How a model is placed, compiled and run. Every field has the default ``load`` uses.

    Placement:
        placement: pins by node name, op type or glob on node names -> device.
        strict: fail instead of falling back to a later device.
        max_copies: fail when a run would copy more tensors between devices than this.
        max_copy_bytes: fail when a run would copy more bytes between devices than this
            (at load where sizes are static; by the run itself otherwise).
        cost_model: let the cost model keep small islands off accelerators.
        placement_policy: ``latency`` (default), ``prefer-first``, ``min-copies``.
        calibration: where the cost model's figures come from: ``"auto"`` (default, or
            ``ANYCHIP_CALIBRATION``): each device measured on this machine once, cached on
            disk (``anychip calibrate``); ``"cached"``: measured figures only where cached;
            ``"off"``: the backends' declared figures.
        explore_budget: the share of the session's run time its feedback may spend trying
            other placements (default 0.05; ``float("inf")``: no limit; decisions/032).
        remember_placement: start from the placement an earlier session of the same model,
            devices, calibrations and options measured best, and explore nothing; record
            this session's decision for the next (None: ``ANYCHIP_REMEMBER_PLACEMENT``, else
            True; ``core/api/remembered.py``).
    Compilation:
        optimize: run the graph optimizations before placement (a Conv's BatchNormalization
            folded into its weights, as onnxruntime's basic level does); False keeps every
            node as written (constant folding always runs).
        device_options: per-device settings, e.g. ``{"npu": {"precision": "fp16"}}``.
        plan_cache_size: memory plans kept per partition for dynamic input shapes.
        compile_cache_size: executables kept per input signature of a static-shape device.
        background_compile: a static-shape device compiles while runs go to the host
            (None: ``ANYCHIP_BACKGROUND_COMPILE``, else True).
        precision: the CPU's math for float32 Conv/MatMul/Gemm/LSTM/GRU/RNN: ``"fp32"``
            (default, or ``ANYCHIP_PRECISION``) or ``"bf16"``: oneDNN converts their inputs
            and weights to bfloat16 inside the kernel and accumulates in float32 (AMX;
            with AVX-512 BF16 alone, or neither, float32 is kept and the report says so;
            docs/decisions/034-precision-policy.md). Tensors stay float32 in memory.
        max_load_bytes: refuse a model whose tensors declare more (``ANYCHIP_MAX_LOAD_BYTES``).
        compile_timeout: seconds one graph compile (NPU, IREE, OpenVINO, a plugin's) may
            take; past it the compile is abandoned and its partition runs on the next device
            (in the background: on the host), with the reason in ``placement()``; with
            ``strict`` a ``CompileTimeout`` naming the partition. Default
            ``ANYCHIP_COMPILE_TIMEOUT``, else 300; None: no limit (``core/plugin/budget.py``).
    Running:
        check_kernels: check each kernel's outputs against the declared dtype and shape
            inference; a mismatch is a ``KernelError`` naming the kernel.
        failover: a device failing in a run is marked unhealthy and the request re-run on the
            others (never with ``strict``); the placement report's first line says so.
        intra_op_num_threads: the CPU's threads for this session's runs (onnxruntime's
            name; 0 or None: the process's count, ``OMP_NUM_THREADS`` or every core). Set
            around each of the session's CPU partition runs, the caller's count put back after.
        free_dimension_overrides: symbolic input dimensions fixed by name at load
            (``{"sequence": 128}``; onnxruntime's ``add_free_dimension_override_by_name``).
        graph_optimization_level: onnxruntime's level, by name or value: ``"disable_all"``
            (0) keeps every node as written (``optimize=False``); ``"basic"`` (1),
            ``"extended"`` (2), ``"all"`` (99) optimize (None: ``optimize`` decides).
        enable_profiling: ``Session.end_profiling()`` writes the profile (per node, partition
            and copy times, a Perfetto trace) of the session's last feeds, re-run under the
            profiler, to ``{profile_file_prefix}_<time>.json`` and returns its path.
        bring_up: for a new device's first days (``core/run/bring_up.py``): failover off,
            kernel outputs checked, each device kernel watched (inputs unchanged, results its
            own tensors) and compared with the CPU's kernel on the same inputs (the first node
            that differs raises ``BringUpError`` with its op, kernel and largest error), and the
            device's memory checked at ``close()``. Slow: never for production runs.
    """

    placement: dict[str, str] | None = None
    strict: bool = False
    max_copies: int | None = None
    max_copy_bytes: int | None = None
    cost_model: bool = True
    placement_policy: str | None = None
    calibration: str | None = None
    explore_budget: float = 0.05
    remember_placement: bool | None = None
    optimize: bool = True
    device_options: Mapping[str, Mapping[str, Any]] | None = None
    plan_cache_size: int = 8
    compile_cache_size: int = 8
    background_compile: bool | None = None
    precision: str | None = None
    max_load_bytes: int | None = None
    compile_timeout: float | None = field(default_factory=default_timeout)
    check_kernels: bool = True
    failover: bool = True
    bring_up: bool = False
    intra_op_num_threads: int | None = None
    free_dimension_overrides: dict[str, int] | None = None
    graph_optimization_level: str | int | None = None
    enable_profiling: bool = False
    profile_file_prefix: str = "anychip_profile"
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.extra:
            raise AnychipError(f"SessionOptions has no field(s) {sorted(self.extra)}")
        for name in ("plan_cache_size", "compile_cache_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AnychipError(f"SessionOptions.{name} must be an int >= 1, got {value!r}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise AnychipError(
                f"SessionOptions.precision must be one of {', '.join(PRECISIONS)}, got "
                f"{self.precision!r}"
            )
        threads = self.intra_op_num_threads
        if threads is not None and (not isinstance(threads, int) or threads < 0):
            raise AnychipError("SessionOptions.intra_op_num_threads must be an int >= 0")
        budget = self.explore_budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget >= 0:
            raise AnychipError(
                f"SessionOptions.explore_budget must be a number >= 0 (a share of the run "
                f"time, 0.05 for 5%), got {budget!r}"
            )
        self.compile_timeout = check_timeout(self.compile_timeout, "SessionOptions.compile_timeout")
        for name in ("max_copies", "max_copy_bytes", "max_load_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise AnychipError(f"SessionOptions.{name} must be None or an int >= 0")

    def optimizes(self) -> bool:
        """``optimize``, or what ``graph_optimization_level`` says when it is set."""
        level = self.graph_optimization_level
        if level is None:
            return self.optimize
        if not isinstance(level, (str, int)):  # onnxruntime's GraphOptimizationLevel
            level = int(level)
        key = (
            level.lower().removeprefix("ort_").removeprefix("enable_")
            if isinstance(level, str)
            else level
        )
        if key in _LEVELS:
            return _LEVELS[key]
        raise AnychipError(
            f"SessionOptions.graph_optimization_level {level!r} is not one of "
            "disable_all (0), basic (1), extended (2), all (99)"
        )

    @classmethod
    def names(cls) -> list[str]:
        """The option names, in declaration order."""
        return [f.name for f in fields(cls) if f.name != "extra"]

    def updated(self, **changes: Any) -> SessionOptions:
        """A copy with ``changes`` applied; an unknown name is an ``AnychipError``."""
        known = self.names()
        if unknown := sorted(set(changes) - set(known)):
            raise AnychipError(
                f"unknown load option(s) {unknown}; known: {', '.join(known)} "
                "(or pass options=anychip.SessionOptions(...))"
            )
        return dataclasses.replace(self, **changes)


def resolve_precision(precision: str | None) -> str:
    """``precision``, else ``ANYCHIP_PRECISION``, else ``"fp32"``; an unknown value in the
    environment is an ``AnychipError`` naming the variable."""
    if precision is not None:
        return precision
    value = os.environ.get("ANYCHIP_PRECISION", "").strip().lower() or "fp32"
    if value not in PRECISIONS:
        raise AnychipError(
            f"ANYCHIP_PRECISION={value!r}: the precisions are {', '.join(PRECISIONS)}"
        )
    return value
