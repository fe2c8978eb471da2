"""cffi declarations parsed once per machine, not once per process.

``cffi.FFI().cdef(text)`` runs pycparser over ``text``: about 100 ms of a fresh process's
first ``anychip.load`` went there (oneDNN's declarations, the native kernels', the generated
C's), more than onnxruntime's whole load of a small model. cffi's *out-of-line ABI mode*
(``set_source(name, None)`` + ``emit_python_code``) writes the parsed declarations as a small
Python module whose import rebuilds the same ``FFI`` without parsing; ``declare`` keeps one
such module per declaration text (keyed by its hash, cffi's and Python's versions) in the
cache folder and imports it on later loads. A module file not owned by this user, or writable
by others, is never imported (it is code): the declarations are parsed in memory instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

__all__ = ["declare"]

_lock = threading.Lock()
_made: dict[str, Any] = {}


def _folder() -> Path | None:
    if os.environ.get("ANYCHIP_COMPILE_CACHE") == "0":
        return None
    from anychip.codegen.build import cache_dir

    return cache_dir() / "ffi"


def declare(cdef: str) -> Any:
    """A ``cffi.FFI`` declaring ``cdef`` (its functions for ``ffi.dlopen``), from the cache
    folder when an earlier process parsed the same text."""
    import cffi

    key = hashlib.sha256(f"{cffi.__version__}|{sys.version_info[:2]}|{cdef}".encode()).hexdigest()[
        :24
    ]
    with _lock:
        if key in _made:
            return _made[key]
        folder = _folder()
        name = f"_anychip_ffi_{key}"
        path = folder / f"{name}.py" if folder is not None else None
        ffi = _imported(name, path) if path is not None else None
        if ffi is None:
            ffi = cffi.FFI()
            ffi.cdef(cdef)
            if path is not None:
                _write(ffi, name, path)
        _made[key] = ffi
        return ffi


def _imported(name: str, path: Path) -> Any | None:
    try:
        st = path.stat()
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None  # someone else's code: parse instead
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module.ffi
    except Exception:  # a truncated or foreign file: parse instead (and rewrite it)
        return None


def _write(ffi: Any, name: str, path: Path) -> None:
    """The out-of-line module of ``ffi``'s declarations at ``path``, written atomically; a
    folder that cannot be written leaves the cache empty, nothing else."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ffi.set_source(name, None)  # out-of-line ABI mode: no C compiler involved
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        with contextlib.redirect_stdout(io.StringIO()):  # it prints "generating <path>"
            ffi.emit_python_code(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except Exception:
        try:
            os.unlink(tmp)
        except (OSError, UnboundLocalError):
            pass
