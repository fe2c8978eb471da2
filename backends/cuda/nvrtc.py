"""NVRTC through ctypes: CUDA C++ source to PTX, with no GPU and no CuPy.

NVRTC (NVIDIA's runtime compiler) is a host library; the ``nvidia-cuda-nvrtc-cu12`` wheel ships
it for Linux x86-64, so generated kernels are compiled in the test suite on machines without
a GPU (the PTX is not run). ``find_library()`` looks in that wheel, then the system's loader.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Sequence
from typing import Any

from anychip.errors import DeviceError, KernelError

__all__ = ["find_library", "compile_ptx", "version"]


@functools.lru_cache(maxsize=1)
def find_library() -> Any:
    """The loaded NVRTC library, or a ``DeviceError`` saying where it was looked for."""
    tried = []
    try:
        import nvidia.cuda_nvrtc as pkg

        base = os.path.join(list(pkg.__path__)[0], "lib")
        for name in sorted(os.listdir(base)):
            if name.startswith("libnvrtc.so"):
                tried.append(os.path.join(base, name))
    except (ImportError, OSError):
        pass
    found = ctypes.util.find_library("nvrtc")
    if found:
        tried.append(found)
    for path in tried:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise DeviceError(
        "NVRTC not found (looked in the nvidia-cuda-nvrtc-cu12 wheel and the system's "
        f"libraries: {tried or 'nothing'}); pip install nvidia-cuda-nvrtc-cu12"
    )


def _check(lib: Any, status: int, what: str) -> None:
    if status != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise KernelError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(status).decode()}")


def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    lib = find_library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def compile_ptx(source: str, name: str = "kernel.cu", options: Sequence[str] = ()) -> str:
    """PTX of ``source``; a ``KernelError`` with NVRTC's log when it does not compile."""
    lib = find_library()
    prog = ctypes.c_void_p()
    _check(
        lib,
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
        "nvrtcCreateProgram",
    )
    try:
        opts = [o.encode() for o in (options or ["--gpu-architecture=compute_75"])]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        status = lib.nvrtcCompileProgram(prog, len(opts), arr)
        if status != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise KernelError(
                f"NVRTC could not compile {name}:\n{log.value.decode(errors='replace')}"
            )
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
