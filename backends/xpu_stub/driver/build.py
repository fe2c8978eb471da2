"""Building and loading the XPU driver: the C sources in this folder are compiled once per
machine into a cache (keyed by compiler, flags, sources and CPU) and bound with cffi in ABI mode.

The driver is compiled with ``-O3 -march=native`` (``$ANYCHIP_XPU_MARCH`` names another
target, e.g. ``haswell`` or ``x86-64``), so the cache key includes the CPU's identity and
feature flags: a library built for one CPU is never loaded on another."""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, NamedTuple

from anychip.codegen.ffi import declare
from anychip.errors import DeviceError

__all__ = ["build_library", "load_library", "source_key", "Library", "DEFAULT_HEAP_BYTES"]

DEFAULT_HEAP_BYTES = 1 << 30
"""Default device heap: 1 GiB of host virtual memory, touched only where tensors are written."""

_SOURCE_DIR = Path(__file__).resolve().parent
_CFLAGS = ("-O3", "-fPIC", "-shared", "-std=c11", "-fvisibility=hidden")
_LDFLAGS = ("-lm", "-pthread")
_FIX = (
    "install a C compiler (e.g. `apt install gcc`) or set CC to one; the XPU stub device "
    "stays unavailable until then"
)


# ---- building and loading ------------------------------------------------------------------


def _cache_root() -> Path:
    from anychip.paths import cache_root

    return cache_root()


def _find_compiler() -> list[str]:
    """The compiler command: ``$CC`` (split like a shell would) or the first of cc, gcc, clang."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        command = shlex.split(cc)
        if shutil.which(command[0]) is None:
            raise DeviceError(
                f"cannot build the XPU driver: the C compiler {command[0]!r} named by $CC was "
                f"not found; {_FIX}"
            )
        return command
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name) is not None:
            return [name]
    raise DeviceError(
        f"cannot build the XPU driver: no C compiler found (tried $CC, cc, gcc, clang); {_FIX}"
    )


def _cflags() -> tuple[str, ...]:
    """Compile flags: the fixed ones and ``-march=$ANYCHIP_XPU_MARCH`` (default native)."""
    march = os.environ.get("ANYCHIP_XPU_MARCH", "").strip() or "native"
    return (*_CFLAGS, f"-march={march}")


def _cpu_identity() -> str:
    """What -march=native depends on: the CPU's vendor, family, model and feature flags."""
    keys = ("vendor_id", "cpu family", "model", "model name", "flags", "Features", "CPU part")
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    first = text.split("\n\n", 1)[0]  # the first processor's block
    lines = [ln for ln in first.splitlines() if ln.split(":", 1)[0].strip() in keys]
    return "\n".join(lines) or f"{platform.machine()} {platform.processor()}"


def _build_key(compiler: list[str], sources: list[Path]) -> str:
    """Hash of everything that changes the built library: sources, command (flags included),
    compiler binary and, because of -march=native, the CPU."""
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(" ".join([*compiler, *_cflags(), *_LDFLAGS]).encode())
    digest.update(_cpu_identity().encode())
    binary = Path(shutil.which(compiler[0]) or compiler[0]).resolve()
    stat = binary.stat()
    digest.update(f"{binary}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def source_key() -> str:
    """A hash of the driver's C sources: what the kernels compute and how fast (the backend's
    ``version``, so a changed kernel is calibrated again)."""
    digest = hashlib.sha256()
    for path in sorted(_SOURCE_DIR.glob("*.c")) + sorted(_SOURCE_DIR.glob("*.h")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def build_library() -> Path:
    """Compiles the driver into the cache unless it is already there, and returns its path.

    Reads ``$CC`` and ``$ANYCHIP_CACHE_DIR`` on every call (tests point them elsewhere).

    Raises:
        DeviceError: no compiler, an unwritable cache folder, or a compile error (with the
            command and the tail of the compiler's stderr).
    """
    compiler = _find_compiler()
    sources = sorted(_SOURCE_DIR.glob("*.c")) + sorted(_SOURCE_DIR.glob("*.h"))
    folder = _cache_root() / "xpu" / _build_key(compiler, sources)
    target = folder / "libxpu.so"
    if target.exists():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix="libxpu-", suffix=".so.tmp", dir=folder)
        os.close(fd)
    except OSError as exc:
        raise DeviceError(
            f"cannot build the XPU driver: the cache folder {folder} is not writable ({exc}); "
            "set ANYCHIP_CACHE_DIR to a writable folder"
        ) from None
    tmp = Path(tmp_name)
    command = [
        *compiler,
        *_cflags(),
        "-o",
        str(tmp),
        *(str(s) for s in sources if s.suffix == ".c"),
        *_LDFLAGS,
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        tmp.unlink(missing_ok=True)
        raise DeviceError(
            f"cannot build the XPU driver: running {shlex.join(command[:1])} failed ({exc}); {_FIX}"
        ) from None
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise DeviceError(
            f"cannot build the XPU driver: the C compiler {compiler[0]!r} exited with status "
            f"{result.returncode}.\ncommand: {shlex.join(command)}\ncompiler output (tail):\n"
            f"{tail}\nFix: {_FIX}"
        )
    from anychip.paths import reserve, stored

    # Room in the bounded store first (paths.py; placed even without: this process loads it),
    # then atomic: other processes see no file or the whole file.
    with reserve(tmp.stat().st_size, None, tmp):
        os.replace(tmp, target)
    stored(target.stat().st_size)
    return target


def _cdef_text() -> str:
    """The declarations between the CDEF markers of xpu.h, as cffi wants them."""
    header = (_SOURCE_DIR / "xpu.h").read_text()
    body = header.split("/* CDEF BEGIN */", 1)[1].split("/* CDEF END */", 1)[0]
    return body.replace("XPU_API ", "")


class Library(NamedTuple):
    ffi: Any
    lib: Any
    kernel_ids: dict[str, int]


_library: Library | None = None
_library_lock = threading.Lock()


def load_library() -> Library:
    """Builds (if needed) and loads the driver once per process."""
    global _library
    with _library_lock:
        if _library is None:
            path = build_library()
            ffi = declare(_cdef_text())
            try:
                lib = ffi.dlopen(str(path))
            except OSError as exc:
                raise DeviceError(
                    f"cannot load the XPU driver {path}: {exc}; delete that file to rebuild it"
                ) from None
            ids = {
                ffi.string(lib.xpu_kernel_name(k)).decode(): k
                for k in range(lib.xpu_kernel_count())
            }
            _library = Library(ffi, lib, ids)
        return _library
