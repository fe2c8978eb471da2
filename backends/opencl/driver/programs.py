"""Building OpenCL programs once, and launching their kernels.

A *program family* (``elementwise``, ``gemm``, ...) is OpenCL C generated from a template for
one element type; shapes, strides and sizes are kernel arguments, so one program serves every
shape and a model needs a handful of builds, not one per node. Programs are built once per
process (``ProgramCache``) and their binaries kept on disk by pyopencl's cache under
``<anychip cache>/opencl/pyopencl/<device key>`` (device, platform and driver version in the
key, so a driver upgrade builds again); PoCL keeps its own cache under ``.../opencl/pocl``. Both
write entries atomically, so concurrent processes may share them.

Build times are recorded (``ProgramCache.builds``) for ``bench/opencl.py``.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from anychip.errors import DeviceError, KernelError

__all__ = ["ProgramCache", "cache_dir", "full_source", "CTYPES"]

#: numpy dtype name -> OpenCL C type, for arithmetic families
CTYPES = {"float32": "float", "float64": "double", "float16": "half"}


def cache_dir() -> Path:
    """Where compiled binaries go: ``$ANYCHIP_OPENCL_CACHE_DIR``; else, when the disk cache is
    off (``ANYCHIP_COMPILE_CACHE=0``, as in the test run), a folder in the temp dir shared by
    the processes of this user; else ``<anychip cache>/opencl``."""
    if os.environ.get("ANYCHIP_OPENCL_CACHE_DIR"):
        return Path(os.environ["ANYCHIP_OPENCL_CACHE_DIR"]).expanduser()
    if os.environ.get("ANYCHIP_COMPILE_CACHE") == "0":
        return Path(tempfile.gettempdir()) / f"anychip-opencl-{os.getuid()}"
    from anychip.backends.opencl.driver.discovery import kernel_cache_dir

    return kernel_cache_dir()


def full_source(ctype: str, source: Callable[[], str]) -> str:
    """The OpenCL C a family is built from for ``ctype``: the extension pragma its type needs
    (``cl_khr_fp64`` for double, ``cl_khr_fp16`` for half: only devices that report it are
    given float16 nodes, ``backend.device_model``), ``T``/``T8`` typedefs, the template."""
    return _prelude(ctype) + source()


def _prelude(ctype: str) -> str:
    lines = []
    if ctype == "double":
        lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if ctype == "half":
        lines.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    lines.append(f"typedef {ctype} T;")
    lines.append(f"typedef {ctype}8 T8;")
    return "\n".join(lines) + "\n"


class ProgramCache:
    """Built programs of one device, keyed by (family, element type)."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self._programs: dict[tuple[str, str], Any] = {}
        self._kernels: dict[tuple[str, str, str], Any] = {}
        self._lock = threading.Lock()
        self.launch_lock = threading.Lock()
        self._typed: set[int] = set()
        #: (family, ctype, seconds) per build in this process
        self.builds: list[tuple[str, str, float]] = []

    def program(self, family: str, ctype: str, source: Callable[[], str]) -> Any:
        """The built program of ``family`` for ``ctype`` (built on first use)."""
        key = (family, ctype)
        prg = self._programs.get(key)
        if prg is not None:
            return prg
        with self._lock:
            prg = self._programs.get(key)
            if prg is None:
                prg = self._build(family, ctype, full_source(ctype, source))
                self._programs[key] = prg
        return prg

    def _build(self, family: str, ctype: str, src: str) -> Any:
        import pyopencl as cl

        info = self.device.info
        folder = cache_dir() / "pyopencl" / info.key
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            folder = None
        t0 = time.perf_counter()
        try:
            prg = cl.Program(self.device.context, src).build(
                options=["-cl-mad-enable", "-cl-no-signed-zeros"],
                cache_dir=str(folder) if folder is not None else None,
            )
        except cl.RuntimeError as e:
            raise DeviceError(
                f"opencl:{info.index} ({info.name}): building the {family} program for "
                f"{ctype} failed: {' '.join(str(e).split())[:600]}"
            ) from e
        self.builds.append((family, ctype, time.perf_counter() - t0))
        if folder is not None:
            _count(folder, prg)
        return prg

    def kernel(self, family: str, ctype: str, name: str, source: Callable[[], str]) -> Any:
        """The kernel ``name`` of a family's program (one ``cl.Kernel`` object per name)."""
        key = (family, ctype, name)
        k = self._kernels.get(key)
        if k is None:
            import pyopencl as cl

            prg = self.program(family, ctype, source)
            try:
                k = cl.Kernel(prg, name)
            except cl.LogicError as e:
                raise KernelError(f"the {family} program has no kernel {name!r}") from e
            self._kernels[key] = k
        return k

    def launch(
        self, kernel: Any, gsize: Sequence[int], lsize: Sequence[int] | None, args: Sequence[Any]
    ) -> None:
        """Enqueue ``kernel`` on the device's queue (set-args and enqueue under one lock)."""
        if any(g <= 0 for g in gsize):
            return
        with self.launch_lock:
            if id(kernel) not in self._typed:
                # Declared scalar types make pyopencl pack arguments in one step: a launch
                # with 20 numpy-scalar arguments costs 26 us instead of 170 us on PoCL.
                kernel.set_scalar_arg_dtypes(
                    [a.dtype if isinstance(a, np.generic) else None for a in args]
                )
                self._typed.add(id(kernel))
            kernel(self.device.queue, tuple(gsize), None if lsize is None else tuple(lsize), *args)


def _count(folder: Path, prg: Any) -> None:
    """pyopencl's cache wrote (or found) the program's binaries under ``folder``: counted in
    anychip's bounded store when that folder is in it (``paths.stored``)."""
    from anychip.paths import cache_root, stored

    root = cache_root()
    if root not in folder.parents:
        return  # ANYCHIP_COMPILE_CACHE=0's temporary folder
    try:
        nbytes = sum(len(b) for b in prg.binaries)
    except Exception:  # a driver that does not give its binaries: nothing to count
        return
    stored(nbytes, root)
