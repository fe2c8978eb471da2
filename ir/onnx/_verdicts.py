"""onnx.checker's passes and shape inference's results remembered across processes, keyed
by the model's bytes.

``onnx.checker.check_model`` on a proto serialises the whole model for onnx's C++ code: that,
not the checks, is its cost (SqueezeNet's 5 MB: 8 ms of 9; ResNet-50's 100 MB: 240 ms of
290). Shape inference on the weightless copy (``_checks.infer_shapes``) is 10-50 ms more on
SqueezeNet. A fresh process loading the same file again paid both again. So one record per
model, ``imported/<digest>.pb`` in anychip's cache folder (``paths.write_atomic``: the
folder's bound applies), holds whether the checker passed it cleanly, inference's result
(weightless, a few KB) and the warnings inference gave (declarations it overrode: issued
again); a later import of the same bytes skips what the record answers. A record is written
only when checking and inferring took ``WORTH_S`` or more (a small model's are cheaper than
the write), and carries a digest of its body (a damaged one is ignored).

What the key holds, so a record is never used for another model: the SHA-256 of the file's
(or the given bytes') content; onnx's version (its checker's rules, its inference);
anychip's version and the name, size and modification time of the importer's modules that
rewrite the proto before the check and infer its shapes (``_import.py``, ``_lenient.py``,
``_checks.py``, ``_external.py``, ``_declared.py``: an edited importer is another key); and
the free-dimension overrides. Only a clean pass is recorded as one: a failure raises (nothing
written), and a failure forgiven because a plugin defines the domain the checker complained
about checks again next time. Not kept at all: a model given as an ``onnx.ModelProto``
(hashing it would mean serialising it, the cost saved), a model with external data (the
other files are not in the key), a model over protobuf's 2 GiB cap (checked by path), an
inference that failed (the model itself came back: inferred again).
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

__all__ = ["Kept", "record_path", "kept", "keep", "WORTH_S"]

_FORMAT = 2
#: The modules whose code shapes the proto the checker sees (their stat is in the key).
_IMPORTER = ("_import.py", "_lenient.py", "_checks.py", "_external.py", "_declared.py")
#: Checker + inference time below which nothing is written: a record costs a reserved write
#: into the bounded cache folder (1-4 ms), more than a small model's check and inference.
WORTH_S = 0.005


class Kept:
    """What an earlier import of the same bytes answered: whether the checker passed them
    cleanly, shape inference's result (None: not kept) and the warnings it gave."""

    __slots__ = ("passed", "inferred", "notes")

    def __init__(self, passed: bool, inferred: Any, notes: list[str]) -> None:
        self.passed = passed
        self.inferred = inferred
        self.notes = notes


def record_path(data: bytes, free_dims: Mapping[str, int] | None) -> Path | None:
    """The record of ``data`` (a model's bytes) as the importer makes them into the proto it
    checks and infers; None when nothing is kept (``ANYCHIP_CHECKER_CACHE=0``)."""
    if os.environ.get("ANYCHIP_CHECKER_CACHE", "1") == "0":
        return None
    from anychip.paths import cache_root

    digest = hashlib.sha256(_context(free_dims).encode())
    digest.update(b"\0")
    digest.update(data)
    return cache_root() / "imported" / f"{digest.hexdigest()[:40]}.pb"


def kept(path: Path | None) -> Kept | None:
    """The record at ``path`` (marked used), or None: none, not ours, or damaged (its digest
    does not match: the import checks and infers again)."""
    if path is None:
        return None
    try:
        head, meta, payload = path.read_bytes().split(b"\n", 2)
        info = json.loads(meta)
        passed, notes, shapes = bool(info["passed"]), list(info["notes"]), bool(info["shapes"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if head != _head(path, meta + b"\n" + payload):
        return None
    inferred = None
    if shapes:
        import onnx

        inferred = onnx.ModelProto()
        try:
            inferred.ParseFromString(payload)
        except Exception:
            return None
    from anychip.paths import used

    used(path)
    return Kept(passed, inferred, [str(n) for n in notes])


def keep(path: Path | None, record: Kept) -> None:
    """Write ``record`` for the model ``path`` was made for (a failure to write only means
    the next import checks and infers again)."""
    if path is None or (not record.passed and record.inferred is None):
        return
    from anychip.paths import write_atomic

    try:
        payload = b"" if record.inferred is None else record.inferred.SerializeToString()
        meta = json.dumps(
            {"passed": record.passed, "notes": record.notes, "shapes": record.inferred is not None}
        ).encode()
        rest = meta + b"\n" + payload
        write_atomic(path, _head(path, rest) + b"\n" + rest)
    except (OSError, ValueError):
        pass  # a read-only cache folder, or past protobuf's cap


def _head(path: Path, rest: bytes) -> bytes:
    digest = hashlib.sha256(rest).hexdigest()[:32]
    return f"anychip import record {_FORMAT} {path.stem} {digest}".encode()


def _context(free_dims: Mapping[str, int] | None) -> str:
    """Everything beside the bytes that decides the checker's verdict and the inference."""
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
