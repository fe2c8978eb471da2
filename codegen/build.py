"""Building generated C: gcc (or ``$CC``) into a shared object, loaded through cffi's ABI mode.

* **Flags** ``-O3 -march=native -fno-math-errno -fno-trapping-math -ffp-contract=off``,
  never ``-ffast-math``: results stay IEEE (NaN, infinities, signed zeros, denormals; the ONNX
  conformance suite runs through fused chains). ``-fno-math-errno`` only stops ``sqrtf``
  from setting ``errno`` and ``-fno-trapping-math`` only drops the floating-point exception
  *flags* (nothing reads either): together they let gcc inline ``floorf`` and turn the
  selects of ``ac_expf`` into vector blends (without the second, the loop of
  ``x * sigmoid(x)`` was not vectorized: 130 ms for 4M floats against numpy's 105);
  ``-ffp-contract=off`` keeps ``a * b + c`` rounded as numpy rounds it.
* **ABI mode** (``ffi.dlopen``): gcc alone builds the ``.so`` in 0.1-0.3 s; cffi's API mode
  goes through setuptools (0.4-1.1 s measured).
* **Cache**: ``<anychip cache>/codegen/<key>.so``; the key hashes the source, the flags, the
  compiler's version and the CPU (``-march=native`` code runs on this CPU model only). With
  ``ANYCHIP_COMPILE_CACHE=0`` (the test run) a per-user folder in the temp dir;
  ``ANYCHIP_CODEGEN_CACHE_DIR`` overrides both. Written under a temporary name and renamed,
  so concurrent processes share it. Each library is loaded once per process.
* **OpenMP** (``load(..., openmp=True)``): built with ``-fopenmp``, which links the system
  ``libgomp.so.1`` (the caller sets libgomp's wait policy first: the CPU's ``native/omp.py``);
  where that build fails (a compiler without OpenMP) the same source is built without it,
  its ``#ifdef _OPENMP`` parts left out, and runs on one thread.
* **No compiler** (``$CC`` names a missing program, or none of gcc/cc/clang exists) or a failed
  build: ``load`` returns None and the caller uses its numpy fallback; the reason is kept in
  ``status()``.
* **The compiler's version** (part of every key) is asked once per compiler binary and kept
  beside the libraries (``cc-<key>.txt``, keyed by the binary's path, size and modification
  time): a process that only loads built libraries starts no compiler.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anychip.codegen.ffi import declare

__all__ = ["FLAGS", "OPENMP", "compiler", "cc_key", "cache_dir", "load", "status", "builds"]

FLAGS = (
    "-O3",
    "-march=native",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=off",
    "-shared",
    "-fPIC",
)
#: Added to ``FLAGS`` for ``load(..., openmp=True)``.
OPENMP = ("-fopenmp",)
log = logging.getLogger("anychip")
_lock = threading.Lock()
_loaded: dict[str, Any] = {}
_failed: dict[str, str] = {}
_compiler: dict[str, tuple[str, str] | None] = {}
_CC_FORMAT = 1
#: (key, seconds) of every build this process ran (cache misses).
builds: list[tuple[str, float]] = []


def compiler() -> tuple[str, str] | None:
    """``(path, version)`` of the C compiler (``$CC``, else gcc, cc, clang), or None."""
    cc = os.environ.get("CC", "")
    if cc in _compiler:
        return _compiler[cc]
    names = [cc] if cc else ["gcc", "cc", "clang"]
    found = None
    for name in names:
        path = shutil.which(name)
        if path is None:
            continue
        version = _version(path)
        if version is None:
            continue
        found = (path, version)
        break
    _compiler[cc] = found
    return found


def _version(path: str) -> str | None:
    """The first line of ``path --version``, kept in the cache folder per compiler binary.

    Asking runs the compiler (a process: 3-10 ms of every process's first run, which loads a
    built library): the answer is kept in ``cache_dir()/cc-<key>.txt``, the key the resolved
    binary's path, size and modification time, so a compiler installed, upgraded or replaced
    at that path is asked again (docs/decisions/055-cold-load-caches.md).
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return None
    ident = f"{_CC_FORMAT} {path} {real} {st.st_size} {st.st_mtime_ns}"
    kept = cache_dir() / f"cc-{hashlib.sha256(ident.encode()).hexdigest()[:24]}.txt"
    try:
        stored_ident, version = kept.read_text(encoding="utf-8").split("\n")[:2]
        if stored_ident == ident and version:
            _count(kept, built=False)
            return version
    except (OSError, ValueError):
        pass  # absent or not ours: asked again, written again
    try:
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
    _keep(kept, f"{ident}\n{version}\n".encode())
    return version


def _keep(path: Path, data: bytes) -> None:
    """Write a small file of the cache folder (the bounded store's ``write_atomic`` when it
    is there); a folder that cannot be written only means asking again."""
    from anychip.paths import cache_root, write_atomic

    try:
        if cache_root() in path.parents:
            write_atomic(path, data, cache_root())
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass


def cache_dir() -> Path:
    """Where built libraries go (see the module docstring)."""
    if os.environ.get("ANYCHIP_CODEGEN_CACHE_DIR"):
        return Path(os.environ["ANYCHIP_CODEGEN_CACHE_DIR"]).expanduser()
    if os.environ.get("ANYCHIP_COMPILE_CACHE") == "0":
        return Path(tempfile.gettempdir()) / f"anychip-codegen-{os.getuid()}"
    from anychip.paths import cache_root

    return cache_root() / "codegen"


@functools.cache
def _cpu() -> str:
    text = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    text += line
                if line.strip() == "":
                    break
    except OSError:
        pass
    return text


def _count(path: Path, built: bool = True) -> None:
    """A library in the cache folder: counted in the bounded store when built, marked used
    when found (``paths.py``); the temporary folder of ``ANYCHIP_COMPILE_CACHE=0`` is not."""
    from anychip.paths import cache_root, stored, used

    root = cache_root()
    if root not in path.parents:
        return
    if built:
        stored(path.stat().st_size, root)
    else:
        used(path)


def _key(source: str, cc: tuple[str, str], flags: tuple[str, ...]) -> str:
    parts = [source, " ".join(flags), cc[1], _cpu()]
    return hashlib.sha256("\n\0".join(parts).encode()).hexdigest()[:40]


def _place(tmp: Path, path: Path) -> None:
    """Rename the built ``tmp`` to ``path``, room reserved for it first when ``path`` is in
    the bounded store (``paths.reserve``: the others' writes under way counted). The library
    is placed even without room (this process loads it; eviction takes it later)."""
    from anychip.paths import cache_root, reserve

    root = cache_root()
    if root not in path.parents:
        os.replace(tmp, path)
        return
    with reserve(tmp.stat().st_size, root, tmp):
        os.replace(tmp, path)


def _build(path: Path, source: str, cc: tuple[str, str], flags: tuple[str, ...]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", dir=path.parent)
    os.close(fd)
    src = tmp + ".c"
    try:
        Path(src).write_text(source, encoding="utf-8")
        t0 = time.perf_counter()
        proc = subprocess.run(
            [cc[0], *flags, "-o", tmp, src, "-lm"], capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{cc[0]} failed: {proc.stderr.strip()[:800]}")
        builds.append((path.stem, time.perf_counter() - t0))
        _place(Path(tmp), path)
        _count(path)
    finally:
        for p in (tmp, src):
            if os.path.exists(p):
                os.unlink(p)


_ENV = os.environ
_ENV_DATA = getattr(_ENV, "_data", None)  # os._Environ's own dict, encoded keys and values
_CC = _ENV.encodekey("CC") if hasattr(_ENV, "encodekey") else "CC"


def cc_key() -> object:
    """``$CC`` as the per-call cache key of the built libraries (tests hide the compiler by
    setting it): its value as ``os.environ`` stores it, or None where unset. Read from the
    environment mapping's own dict: ``os.environ.get`` encodes the key on every call (0.75
    us; seven calls a run of the tiny BERT)."""
    if _ENV_DATA is None:
        return _ENV.get("CC")
    return _ENV_DATA.get(_CC)


def load(source: str, cdef: str, name: str, openmp: bool = False) -> Any | None:
    """The function ``name`` of ``source`` built and loaded (cached on disk and in this
    process), or None when no compiler is present or the build failed (see ``status``).
    ``openmp``: built with ``OPENMP`` where the compiler can, else without."""
    cc = compiler()
    if cc is None:
        _failed["compiler"] = "no C compiler (set CC, or install gcc)"
        return None
    key = _key(source, cc, FLAGS + (OPENMP if openmp else ()))
    fn = _loaded.get(key)
    if fn is not None or key in _failed:
        return fn
    with _lock:
        if key in _loaded or key in _failed:
            return _loaded.get(key)
        tries = [FLAGS + OPENMP, FLAGS] if openmp else [FLAGS]
        errors = []
        for flags in tries:
            try:
                _loaded[key] = _load_built(source, cdef, name, cc, flags)
                return _loaded[key]
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}"[:800])
        _failed[key] = "; ".join(errors)
        log.warning("anychip: generated C not built, numpy fallback: %s", _failed[key])
    return None


def loader(source: str, cdef: str, name: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """``(lib, forget)`` for a kernel module: ``lib()`` is ``(ffi, lib, float[] type)`` of
    ``load(source, cdef, name)``, or None without a compiler, kept per ``cc_key()`` (tests
    hide the compiler with ``$CC``); the type is resolved once (a type string is looked up
    on every call). ``forget()`` drops what was kept: look for the compiler again."""
    built: dict[object, Any] = {}

    def lib() -> Any:
        key = cc_key()
        if key not in built:
            loaded = load(source, cdef, name)
            ffi = None if loaded is None else loaded[0]
            built[key] = None if ffi is None else (ffi, loaded[1], ffi.typeof("float[]"))
        return built[key]

    return lib, built.clear


def _load_built(
    source: str, cdef: str, name: str, cc: tuple[str, str], flags: tuple[str, ...]
) -> tuple[Any, Any, Any]:
    path = cache_dir() / f"{_key(source, cc, flags)}.so"
    if not path.exists():
        _build(path, source, cc, flags)
    else:
        _count(path, built=False)
    ffi = declare(cdef + ";")
    lib = ffi.dlopen(str(path))
    return ffi, lib, getattr(lib, name)


def status() -> dict[str, Any]:
    """Loaded libraries, failures with their reasons, builds this process ran."""
    return {"loaded": len(_loaded), "failed": dict(_failed), "builds": list(builds)}
