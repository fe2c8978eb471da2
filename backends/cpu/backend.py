"""The CPU backend: host memory, numpy kernels; the reference every other backend is tested
against, and the fallback for every node no other device claims."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from anychip.backends.cpu.thread_choice import ThreadChoice, on_threads
from anychip.core.plugin.backend import Backend, DeviceModel
from anychip.errors import DeviceError
from anychip.ir.dtypes import ALL_TYPES

__all__ = ["CpuBackend"]


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class CpuBackend(Backend):
    """numpy on the host. Device tensors are ``np.ndarray``; transfers are no-ops."""

    name = "cpu"
    kind = "cpu"
    priority = 0
    host_memory = True
    #: Bumped when a kernel's speed changes enough to move placements (calibrations measured
    #: before are not read): "2", large transposes by oneDNN's reorder (1024 x 1024: 7 ms ->
    #: 0.8), which the calibration's ``data`` probe times.
    version = "2"
    #: Fusion passes switched off for this session (``device_options={"cpu": ...}``).
    disabled_passes: frozenset[str] = frozenset()
    #: Whether a partition may run on one thread when its runs measured that faster.
    thread_choice: bool = True
    #: Whether static-shape partitions replay their recorded kernel calls
    # (backends/cpu/replay/record.py).
    replay: bool = True
    #: The precision policy (``SessionOptions.precision``): ``"fp32"`` or ``"bf16"``.
    precision: str = "fp32"

    def device_model(self) -> DeviceModel:
        # Rough figures for a few cores running BLAS: only their ratio to other devices matters.
        return DeviceModel(
            "cpu",
            "cpu",
            memory_capacity=_host_memory_bytes(),
            dtypes=ALL_TYPES,
            flops=5e10,
            mem_bandwidth=1e10,
            host_link=None,
            launch_overhead=2e-6,
        )

    @property
    def about(self) -> str:  # type: ignore[override]
        """The CPU's model and features, and what the backend uses of them (``anychip
        devices``): oneDNN or not, bf16 products for ``precision="bf16"`` or not."""
        from anychip.backends.cpu.features import bf16_math, summary
        from anychip.backends.cpu.onednn import _lib

        onednn = (
            "oneDNN"
            if _lib.findable()
            else "no oneDNN (pip install 'anychip[onednn]': Conv, "
            "pooling and large products run on numpy, several times slower)"
        )
        able, how = bf16_math()
        return f"{summary()}; {onednn}; bf16: {how if able else 'no'}"

    def _copy_in(self, array: np.ndarray) -> np.ndarray:
        return array

    def _copy_out(self, tensor: np.ndarray) -> np.ndarray:
        return tensor

    def runner(self, partition: Any, memory: Any) -> Any:
        """A partition's runs: its recorded kernel calls replayed where it has more than one
        node and ``replay`` is on (``replay/``), on the threads given or on one, as its runs
        measured (``thread_choice.py``); with oneDNN there, with numpy's OpenBLAS at one
        thread (``core/run/blas.py``: its spinning workers starved oneDNN's OpenMP team)."""
        from anychip.backends.cpu.onednn import _lib

        if self.replay and len(memory.program.instrs) >= 2:
            from anychip.backends.cpu.replay.run import Replay
            from anychip.backends.cpu.replay.state import apply, capture

            replay = Replay(memory.program, capture, apply, memory.arena_for, memory.outputs.copy)
            replay.info = partition.info  # what its recordings did, in the partition's info
            if not replay.off:
                memory.intercept(replay.run)
        choose = self.thread_choice and os.environ.get("ANYCHIP_THREAD_CHOICE", "1") != "0"
        program = ThreadChoice(memory.runner, partition.info, choose)
        if not _lib.findable():
            if self.precision != "fp32":
                partition.info["precision"] = "fp32 (bf16 asked; oneDNN is not installed)"
        else:
            from anychip.core.run.blas import single_blas_thread

            program = single_blas_thread(program)
            if self.precision != "fp32":
                from anychip.backends.cpu.features import bf16_math

                able, how = bf16_math()
                partition.info["precision"] = f"bf16 products by {how}" if able else f"fp32: {how}"
                program = _InMath(program, self.precision) if able else program
        threads = getattr(self, "threads", None)
        return program if threads is None else on_threads(program, threads)

    # -- fusion passes (backends/cpu/passes) ----------------------------------------------
    def _configure(self, **options: Any) -> None:
        from anychip.backends.cpu.passes import PASS_NAMES

        known = {"disabled_passes", "fusion", "thread_choice", "replay", "precision", "threads"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise DeviceError(
                f"cpu takes the options disabled_passes, fusion, thread_choice, replay, "
                f"precision and threads, not {unknown}"
            )
        self.precision = options.get("precision", "fp32")
        if self.precision not in ("fp32", "bf16"):
            raise DeviceError(f"cpu: precision is 'fp32' or 'bf16', not {self.precision!r}")
        threads = options.get("threads")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise DeviceError(f"cpu: threads is an int >= 1 (or None), not {threads!r}")
        #: The session's thread count (``intra_op_num_threads``), None: the process's.
        self.threads = threads
        for flag in ("thread_choice", "replay"):
            if not isinstance(options.get(flag, True), bool):
                raise DeviceError(f"cpu: {flag} is True or False")
        self.thread_choice = options.get("thread_choice", True)
        self.replay = options.get("replay", True)
        names = set(options.get("disabled_passes") or ())
        if bad := sorted(names - set(PASS_NAMES) - {"all"}):
            raise DeviceError(f"cpu: no pass named {bad}; its passes are {', '.join(PASS_NAMES)}")
        if options.get("fusion", True) is False:
            names.add("all")
        self.disabled_passes = frozenset(names)

    @property
    def passes(self) -> list[Any]:
        """The registered passes minus those disabled here or by ``ANYCHIP_DISABLED_PASSES``."""
        env = {s.strip() for s in os.environ.get("ANYCHIP_DISABLED_PASSES", "").split(",")}
        off = self.disabled_passes | env
        if "all" in off:
            return []
        return [p for p in super().passes if p.name not in off]


class _InMath:
    """A partition's runs with oneDNN's math mode set (``onednn/_math.py``): every primitive
    its kernels build or pick is the ``precision`` one."""

    __slots__ = ("program", "precision", "__weakref__")

    def __init__(self, program: Any, precision: str) -> None:
        self.program = program
        self.precision = precision

    def __call__(self, inputs: list[Any]) -> list[Any]:
        from anychip.backends.cpu.onednn._math import mode

        with mode(self.precision):
            return self.program(inputs)

    def __getattr__(self, name: str) -> Any:  # the wrapped runner's own (close, info...)
        return getattr(self.program, name)
