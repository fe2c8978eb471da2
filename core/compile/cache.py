"""Compiled artifacts on disk, so a second process does not compile again.

A graph-mode backend opts in with ``Backend.cache_compiled = True``: its compile is a function
of the graph its passes produce. The artifact is that graph (passes applied, shapes concrete),
stored as ONNX; loading it skips the tracing run and the passes, and hands the graph to
``backend.compile``. (For the simulated NPU that leaves the builders, the memory plan and
placing the weights, which a real driver's blob would hold too.)

The key hashes the partition graph as placed (its ONNX bytes, weights included), the input
signature, the backend's class, ``version`` and ``cache_tag`` (options that change the
compiled code, e.g. the NPU's precision), and anychip's version. A file is
``MAGIC | format | key | sha256(payload) | payload``; one whose magic, format, key or digest
does not match is *foreign or corrupt*: it is removed and never loaded, and the partition is
compiled again. Writes are atomic (rename). Counters: hits, stores, rejected.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

from anychip.paths import cache_root

__all__ = ["DiskCache", "graph_digest", "MAGIC"]

MAGIC = b"ANYCHIPC"
FORMAT = 1
log = logging.getLogger("anychip")


def graph_digest(graph: Any) -> str:
    """sha256 of the graph's ONNX bytes (structure, shapes and weights)."""
    from anychip.ir.graph import Model
    from anychip.ir.onnx import export_model

    return hashlib.sha256(export_model(Model(graph)).SerializeToString()).hexdigest()


class DiskCache:
    """Artifacts under ``<cache>/compiled/`` (``$ANYCHIP_CACHE_DIR`` or ``~/.cache/anychip``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or cache_root() / "compiled"
        self.stats = {"hits": 0, "stores": 0, "rejected": 0}
        self._lock = threading.Lock()

    def key(self, backend: Any, digest: str, signature: tuple) -> str:
        from anychip.version import __version__

        parts = [
            f"{type(backend).__module__}.{type(backend).__qualname__}",
            str(getattr(backend, "version", "")),
            str(getattr(backend, "cache_tag", "")),
            __version__,
            digest,
            repr(signature),
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.bin"

    def load(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (missing; foreign or corrupt: removed)."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        head = len(MAGIC) + 1 + 64 + 64
        ok = (
            len(data) >= head
            and data[: len(MAGIC)] == MAGIC
            and data[len(MAGIC)] == FORMAT
            and data[len(MAGIC) + 1 : len(MAGIC) + 65].decode("ascii", "replace") == key
        )
        payload = data[head:]
        digest = data[len(MAGIC) + 65 : head].decode("ascii", "replace")
        if not ok or hashlib.sha256(payload).hexdigest() != digest:
            with self._lock:
                self.stats["rejected"] += 1
            log.warning("anychip: compiled artifact %s is corrupt or foreign; rebuilding", path)
            path.unlink(missing_ok=True)
            return None
        with self._lock:
            self.stats["hits"] += 1
        return payload

    def store(self, key: str, payload: bytes) -> None:
        """Write ``payload`` under ``key`` atomically; a failure to write is only logged."""
        path = self._path(key)
        digest = hashlib.sha256(payload).hexdigest().encode()
        blob = MAGIC + bytes([FORMAT]) + key.encode() + digest + payload
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        except OSError as e:
            log.warning("anychip: could not store the compiled artifact %s: %s", path, e)
            return
        with self._lock:
            self.stats["stores"] += 1


def compile_graph_cached(
    backend: Any,
    graph: Any,
    signature: tuple,
    disk: DiskCache | None,
    schemas: Any,
    *,
    digest: str | None = None,
    only_from_disk: bool = False,
) -> tuple[Any, bool]:
    """``backend.compile`` of ``graph`` after the backend's passes, through ``disk`` when the
    backend opts in: returns ``(CompiledGraph, loaded from disk)``; ``(None, False)`` on a
    miss with ``only_from_disk``. ``graph`` is rewritten by the passes when compiled here.
    ``digest`` keys the artifact (default: ``graph``'s own; a specialized partition passes its
    symbolic graph's, so a process finds the artifact before tracing)."""
    from anychip.ir.graph import Model
    from anychip.ir.onnx import export_model, import_model
    from anychip.ir.passes import PassManager

    key = None
    if disk is not None and getattr(backend, "cache_compiled", False):
        key = disk.key(backend, digest or graph_digest(graph), signature)
        payload = disk.load(key)
        if payload is not None:
            try:
                ready = import_model(payload, custom_schemas=schemas).graph
                return backend.compile(ready), True
            except Exception as e:
                log.warning("anychip: compiled artifact unusable (%s); compiling again", e)
                disk._path(key).unlink(missing_ok=True)
    if only_from_disk:
        return None, False
    if backend.passes:  # one manager: the graph is verified after every pass
        PassManager(backend.passes, max_iterations=1)(graph)
    compiled = backend.compile(graph)
    if key is not None:
        disk.store(key, export_model(Model(graph)).SerializeToString())
    return compiled, False
