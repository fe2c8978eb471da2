"""Optional C kernels of the CPU backend, compiled once per machine and bound with cffi (ABI
mode), for loops numpy cannot vectorise well (tree walks, whose depth is data-dependent; the SVM's
iterative probability coupling).

``library()`` builds ``*.c`` in this folder into the cache (``$ANYCHIP_CACHE_DIR`` or
``~/.cache/anychip``, keyed by the sources, flags and compiler) and returns the loaded
library, or None when there is no C compiler, the build fails, or ``ANYCHIP_NATIVE=0``: every
caller keeps a numpy path, so the native code changes speed, never results.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from anychip.codegen.ffi import declare

__all__ = ["library", "ffi"]

_DIR = Path(__file__).resolve().parent
_FLAGS = ("-O2", "-fPIC", "-shared", "-std=c11", "-fvisibility=hidden", "-pthread")
_CDEF = """
void tree_leaves_f32(const float*, int64_t, int64_t, const int64_t*, const double*,
                     const int8_t*, const int64_t*, const int64_t*, const uint8_t*,
                     const int64_t*, int64_t, int64_t*);
void tree_leaves_f64(const double*, int64_t, int64_t, const int64_t*, const double*,
                     const int8_t*, const int64_t*, const int64_t*, const uint8_t*,
                     const int64_t*, int64_t, int64_t*);
void leaf_sum_f32(const int64_t*, int64_t, int64_t, const float*, int64_t, float*);
void leaf_sum_f64(const int64_t*, int64_t, int64_t, const double*, int64_t, double*);
void tree_sum_f32(const float*, int64_t, int64_t, const int64_t*, const double*,
                  const int8_t*, const int64_t*, const int64_t*, const uint8_t*,
                  const int64_t*, int64_t, const float*, int64_t, float*);
void tree_sum_f64(const double*, int64_t, int64_t, const int64_t*, const double*,
                  const int8_t*, const int64_t*, const int64_t*, const uint8_t*,
                  const int64_t*, int64_t, const double*, int64_t, double*);
typedef struct {
    double threshold;
    int32_t feature, true_child, false_child;
    int8_t rule;
    uint8_t missing;
} packed_node;
void tree_packed_sum(int, const void*, int64_t, int64_t, const packed_node*, const int64_t*,
                     int64_t, int, const void*, int64_t, void*, int);
void tree_packed_sum_groups(int, const void*, int64_t, int64_t, const packed_node*,
                            const int64_t*, const int64_t*, int64_t, int, const void*, int64_t,
                            void*, int);
int svm_couple(const float*, int64_t, int64_t, float*);
"""
_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


def _cache_root() -> Path:
    from anychip.paths import cache_root

    return cache_root()


def _build() -> Path | None:
    compiler = (
        os.environ.get("CC", "").split()[:1]
        or [c for c in ("cc", "gcc", "clang") if shutil.which(c)][:1]
    )
    if not compiler or shutil.which(compiler[0]) is None:
        return None
    sources = sorted(_DIR.glob("*.c"))
    digest = hashlib.sha256(" ".join([*compiler, *_FLAGS]).encode())
    for s in sources:
        digest.update(s.read_bytes())
    folder = _cache_root() / "cpu-native" / digest.hexdigest()[:16]
    target = folder / "libanychip_cpu.so"
    if target.exists():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=folder)
        os.close(fd)
        command = [*compiler, *_FLAGS, "-o", tmp, *map(str, sources), "-lm"]
        done = subprocess.run(command, capture_output=True, timeout=300)
        if done.returncode != 0:
            os.unlink(tmp)
            return None
        from anychip.paths import reserve

        # Room in the bounded store first (paths.py; placed even without: this process loads
        # it), then atomic: other processes see no file or the whole file.
        with reserve(os.path.getsize(tmp), None, Path(tmp)):
            os.replace(tmp, target)
    except (OSError, subprocess.TimeoutExpired):
        return None
    from anychip.paths import stored

    stored(target.stat().st_size)  # the bounded store (paths.py)
    return target


def library() -> Any | None:
    """The loaded C library, or None (no compiler, a failed build, ``ANYCHIP_NATIVE=0``)."""
    if os.environ.get("ANYCHIP_NATIVE", "1") == "0":
        return None
    with _LOCK:
        if "lib" not in _STATE:
            _STATE["lib"] = None
            path = _build()
            if path is not None:
                try:
                    _STATE["lib"] = ffi().dlopen(str(path))
                except OSError:
                    _STATE["lib"] = None
        return _STATE["lib"]


def ffi() -> Any:
    """The cffi FFI object that declares the library's functions."""
    if "ffi" not in _STATE:
        _STATE["ffi"] = declare(_CDEF)
    return _STATE["ffi"]
