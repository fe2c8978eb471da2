"""onnx.checker's passes and shape inference's results remembered across processes, keyed
by the model's bytes.

``onnx.checker.check_model`` on a proto serialises the whole model for onnx's C++ code: that,
not the checks, is its cost (SqueezeNet's 5 MB: 8 ms of 9; ResNet-50's 100 MB: 240 ms of
290). A fresh process loading the same file again pays it again. So a check that passed is
recorded under ``checked/<digest>`` in anychip's cache folder (``paths.write_atomic``: the
folder's bound applies), and a later import of the same bytes skips the checker. Shape
inference on the weightless copy (``_checks.infer_shapes``: SqueezeNet 10-50 ms) is a
function of the same things: its result (weightless, a few KB) is kept under
``shapes/<digest>.pb`` with the warnings inference gave (declarations it overrode: issued
again) and parsed back instead (``inferred_before``); a result inference could not give (it
failed: the model itself came back) is not kept.

What the key holds, so a remembered answer is never one for another model: the SHA-256 of
the file's (or the given bytes') content; onnx's version (its checker's rules, its
inference); anychip's version and the name, size and modification time of the importer's
modules that rewrite the proto before the check and infer its shapes (``_import.py``,
``_lenient.py``, ``_checks.py``, ``_external.py``, ``_declared.py``: an edited importer is
another key); and the free-dimension overrides. Only clean passes are stored: a failure, or
a failure forgiven because a plugin defines the domain the checker complained about, checks
again next time. Not remembered at all: a model given as an ``onnx.ModelProto`` (hashing it
would mean serialising it, the cost saved), a model with external data (the other files are
not in the key), and a model over protobuf's 2 GiB cap (checked by path).
``ANYCHIP_CHECKER_CACHE=0`` checks and infers every time; an unwritable cache folder only
means they run. See docs/decisions/055-cold-load-caches.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "verdict_path",
    "passed_before",
    "remember_pass",
    "inferred_before",
    "remember_inferred",
]

_FORMAT = 1
#: The modules whose code shapes the proto the checker sees (their stat is in the key).
_IMPORTER = ("_import.py", "_lenient.py", "_checks.py", "_external.py", "_declared.py")


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


def inferred_before(verdict: Path | None) -> tuple[Any, list[str]] | None:
    """The shape inference result kept for the model ``verdict`` was made for (an
    ``onnx.ModelProto``) with the warnings inference gave, or None (none kept, or one whose
    digest does not match)."""
    if verdict is None:
        return None
    path = _shapes_path(verdict)
    try:
        head, notes_line, payload = path.read_bytes().split(b"\n", 2)
        notes = [str(n) for n in json.loads(notes_line)]
    except (OSError, ValueError, TypeError):
        return None
    if head != _shapes_head(verdict, notes_line + b"\n" + payload):
        return None  # not ours, or damaged: inferred again, written again
    import onnx

    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(payload)
    except Exception:
        return None
    from anychip.paths import used

    used(path)
    return proto, notes


def remember_inferred(verdict: Path | None, inferred: Any, notes: list[str]) -> None:
    """Keep ``inferred`` (shape inference's result for the model ``verdict`` was made for)
    and the warnings it gave (issued again with a kept result)."""
    if verdict is None:
        return
    from anychip.paths import write_atomic

    try:
        body = json.dumps(notes).encode() + b"\n" + inferred.SerializeToString()
        write_atomic(_shapes_path(verdict), _shapes_head(verdict, body) + b"\n" + body)
    except (OSError, ValueError):
        pass  # a read-only cache folder, or past protobuf's cap: inferred again next time


def _shapes_path(verdict: Path) -> Path:
    return verdict.parent.parent / "shapes" / f"{verdict.stem}.pb"


def _shapes_head(verdict: Path, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()[:32]
    return f"anychip inferred shapes {_FORMAT} {verdict.stem} {digest}".encode()


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
    parts.append(f"free_dims {sorted((repr(k), repr(v)) for k, v in (free_dims or {}).items())}")
    return "\n".join(parts)
