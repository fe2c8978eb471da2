"""onnx.checker's passes remembered across processes, keyed by the model's bytes.

``onnx.checker.check_model`` on a proto serialises the whole model for onnx's C++ code: that,
not the checks, is its cost (SqueezeNet's 5 MB: 8 ms of 9; ResNet-50's 100 MB: 240 ms of
290). A fresh process loading the same file again pays it again. So a check that passed is
recorded under ``checked/<digest>`` in anychip's cache folder (``paths.write_atomic``: the
folder's bound applies), and a later import of the same bytes skips the checker.

What the key holds, so a remembered pass is never a pass for another model: the SHA-256 of
the file's (or the given bytes') content; onnx's version (its checker's rules); anychip's
version and the name, size and modification time of the importer's modules that rewrite the
proto before the check (``_import.py``, ``_lenient.py``, ``_checks.py``, ``_external.py``:
an edited importer is another key); and the free-dimension overrides. Only clean passes are
stored: a failure, or a failure forgiven because a plugin defines the domain the checker
complained about, checks again next time. Not remembered at all: a model given as an
``onnx.ModelProto`` (hashing it would mean serialising it, the cost saved), a model with
external data (the other files are not in the key), and a model over protobuf's 2 GiB cap
(checked by path). ``ANYCHIP_CHECKER_CACHE=0`` checks every time; an unwritable cache folder
only means the checker runs. See docs/decisions/055-cold-load-caches.md.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["verdict_path", "passed_before", "remember_pass"]

_FORMAT = 1
#: The modules whose code shapes the proto the checker sees (their stat is in the key).
_IMPORTER = ("_import.py", "_lenient.py", "_checks.py", "_external.py")


def verdict_path(data: bytes, free_dims: Mapping[str, int] | None) -> Path | None:
    """The file that records a pass of ``data`` (a model's bytes) as the importer makes them
    into the proto it checks; None when passes are not remembered (switched off)."""
    if os.environ.get("ANYCHIP_CHECKER_CACHE", "1") == "0":
        return None
    from anychip.paths import cache_root

    digest = hashlib.sha256(_context(free_dims).encode())
    digest.update(b"\0")
    digest.update(data)
    return cache_root() / "checked" / f"{digest.hexdigest()[:40]}.ok"


def passed_before(path: Path | None) -> bool:
    """Whether ``path`` records a pass (marked used when it does)."""
    if path is None:
        return False
    try:
        body = path.read_bytes()
    except OSError:
        return False
    if body != _body(path):
        return False  # not ours, or half of something: checked again, written again
    from anychip.paths import used

    used(path)
    return True


def remember_pass(path: Path | None) -> None:
    """Record that the checker passed the model ``path`` was made for."""
    if path is None:
        return
    from anychip.paths import write_atomic

    try:
        write_atomic(path, _body(path))
    except OSError:
        pass  # a read-only cache folder: the next process checks again


def _body(path: Path) -> bytes:
    return f"anychip checker pass {_FORMAT} {path.stem}\n".encode()


def _context(free_dims: Mapping[str, int] | None) -> str:
    """Everything beside the bytes that decides the checker's verdict."""
    import onnx

    from anychip.version import __version__

    parts = [f"format {_FORMAT}", f"onnx {onnx.__version__}", f"anychip {__version__}"]
    folder = os.path.dirname(os.path.abspath(__file__))
    for name in _IMPORTER:
        try:
            st = os.stat(os.path.join(folder, name))
            parts.append(f"{name} {st.st_size} {st.st_mtime_ns}")
        except OSError:
            parts.append(f"{name} ?")
    parts.append(f"free_dims {sorted((free_dims or {}).items())!r}")
    return "\n".join(parts)
