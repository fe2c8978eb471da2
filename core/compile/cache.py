"""Compiled bytes on disk, so a second process loads instead of compiling.

A graph-mode backend takes part by overriding ``Backend.load_compiled`` and building its
``CompiledGraph`` with ``serialize=`` (``core/plugin/backend.py``): after a compile the cache
stores ``compiled.serialize()``; a later process hands the stored bytes to
``backend.load_compiled`` and skips the tracing run, the backend's passes and its compiler.
A ``serialize()`` that returns None or raises leaves the partition uncached (it still runs).

The key hashes everything that changes the result:

* the partition graph as placed (``graph_digest``): its ONNX structure with the opset imports
  of its own nodes and every node's resolved schema version, and every initializer's bytes;
* the input signature (shapes and dtypes);
* the backend: name, class, ``version``, ``cache_tag`` and ``options`` (device options);
* anychip's version and this file's ``FORMAT``.

A file is ``MAGIC | format | key | sha256(payload) | payload``; one whose magic, format, key
or digest does not match, or whose payload the backend refuses, is *foreign or corrupt*: it
is logged, removed and never used, and the partition is compiled again. Writes go to a
temporary file renamed into place, so processes sharing the folder never read half a file.
Counters: hits, stores, rejected.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from anychip.paths import cache_root, reserve, stored, used

__all__ = [
    "DiskCache",
    "graph_digest",
    "cache_key",
    "load_cached",
    "compile_and_store",
    "compile_graph_cached",
    "MAGIC",
]

MAGIC = b"ANYCHIPC"
FORMAT = 2
_HEAD = len(MAGIC) + 1 + 64 + 64
log = logging.getLogger("anychip")


def graph_digest(graph: Any) -> str:
    """sha256 of ``graph``: its ONNX structure (opset imports from its nodes' versions, every
    node's resolved schema version) and its initializers' bytes, hashed where they lie."""
    from anychip.ir.clone import copy_model
    from anychip.ir.graph import Model
    from anychip.ir.onnx import export_model

    h = hashlib.sha256()
    opsets: dict[str, int] = {}
    for node in graph.walk():
        h.update(f"{node.domain}:{node.op_type}:{node.version}:{node.meta.get('since')};".encode())
        if node.version is not None:
            opsets[node.domain] = max(opsets.get(node.domain, 0), int(node.version))
    # The structure without the weights' bytes: a copy whose initializers are inputs of the
    # same name, type and shape (the copy shares the arrays; the original is not touched).
    skeleton = copy_model(Model(graph, opsets or None)).graph
    listed = {v.name for v in skeleton.inputs}
    for name, v in sorted(skeleton.initializers.items()):
        data = np.ascontiguousarray(v.const)
        h.update(f"init:{name}:{data.dtype.str}:{data.shape}:{name in listed};".encode())
        h.update(memoryview(data).cast("B") if data.dtype != object else repr(data).encode())
        v.const = None
        if name not in listed:
            skeleton.inputs.append(v)
    skeleton.initializers.clear()
    h.update(export_model(Model(skeleton, opsets or None)).SerializeToString())
    return h.hexdigest()


class DiskCache:
    """Compiled bytes under ``<cache>/compiled/`` (``$ANYCHIP_CACHE_DIR`` or
    ``~/.cache/anychip``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or cache_root() / "compiled"
        self.stats = {"hits": 0, "stores": 0, "rejected": 0}
        self._lock = threading.Lock()
        #: Keys loaded or stored by this process, in order (a session's export takes those
        #: after its load began: ``core/api/export.py``).
        self.touched: list[str] = []

    def key(self, backend: Any, digest: str, signature: tuple) -> str:
        """The artifact's name: a hash of everything that changes the compiled result."""
        from anychip.version import __version__

        options = sorted((str(k), repr(v)) for k, v in backend.options.items())
        parts = [
            f"format={FORMAT}",
            f"backend={backend.name}",
            f"{type(backend).__module__}.{type(backend).__qualname__}",
            f"version={backend.version}",
            f"tag={backend.cache_tag}",
            f"options={options!r}",
            f"anychip={__version__}",
            f"graph={digest}",
            f"signature={signature!r}",
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.bin"

    def load(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None (missing; foreign or corrupt: removed)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                head = f.read(_HEAD)
                payload = f.read()  # its own bytes object: no copy of a slice
        except OSError:
            return None
        ok = (
            len(head) == _HEAD
            and head[: len(MAGIC)] == MAGIC
            and head[len(MAGIC)] == FORMAT
            and head[len(MAGIC) + 1 : len(MAGIC) + 65].decode("ascii", "replace") == key
            and hashlib.sha256(payload).hexdigest()
            == head[len(MAGIC) + 65 :].decode("ascii", "replace")
        )
        if not ok:
            self.reject(key, "its header or digest does not match")
            return None
        with self._lock:
            self.stats["hits"] += 1
            self.touched.append(key)
        used(path)  # the store's LRU order (paths.py)
        return payload

    def reject(self, key: str, why: str) -> None:
        """Count, log and remove the artifact under ``key``: it is never used."""
        path = self._path(key)
        with self._lock:
            self.stats["rejected"] += 1
        log.warning(
            "anychip: compiled artifact %s is corrupt or foreign (%s); rebuilding", path, why
        )
        path.unlink(missing_ok=True)

    def store(self, key: str, payload: bytes) -> None:
        """Write ``payload`` under ``key`` atomically; a failure to write is only logged."""
        path = self._path(key)
        digest = hashlib.sha256(payload).hexdigest().encode()
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        # room first, under the folder's bound shared with other processes (paths.py)
        with reserve(_HEAD + len(payload), self.root.parent, tmp) as room:
            if not room:
                return
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(tmp, "wb") as f:  # in pieces: the payload is not copied into a blob
                    f.write(MAGIC + bytes([FORMAT]) + key.encode() + digest)
                    f.write(payload)
                os.replace(tmp, path)
            except OSError as e:
                tmp.unlink(missing_ok=True)
                log.warning("anychip: could not store the compiled artifact %s: %s", path, e)
                return
        with self._lock:
            self.stats["stores"] += 1
            self.touched.append(key)
        stored(_HEAD + len(payload), self.root.parent)  # the bounded store (paths.py)

    def file(self, key: str) -> Path:
        """Where the artifact of ``key`` lies (whole: header and payload)."""
        return self._path(key)

    def adopt(self, key: str, data: bytes) -> None:
        """Put a whole artifact file (``file(key)``'s bytes from another machine or folder) in
        place, atomically; ``load`` checks its header and digest as for any other (one the
        store has no room for is left out: compiled again when used)."""
        path = self._path(key)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        with reserve(len(data), self.root.parent, tmp) as room:
            if not room:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)
        stored(len(data), self.root.parent)


def cache_key(backend: Any, disk: DiskCache | None, graph: Any, signature: tuple) -> str | None:
    """The key of ``graph`` (a ``Graph``, or its ``graph_digest``) compiled by ``backend`` for
    ``signature``; None when nothing is looked up on disk (no cache, or the backend does not
    load compiled bytes)."""
    if disk is None or not backend.loads_compiled:
        return None
    digest = graph if isinstance(graph, str) else graph_digest(graph)
    return disk.key(backend, digest, signature)


def load_cached(backend: Any, disk: DiskCache | None, key: str | None) -> Any:
    """The ``CompiledGraph`` stored under ``key``, loaded by ``backend``; None when there is
    none (a file the backend refuses is rejected: logged and removed).

    Raises:
        OutOfMemoryError: a valid artifact that does not fit (a compile would not fit either).
    """
    from anychip.errors import OutOfMemoryError

    if disk is None or key is None:
        return None
    payload = disk.load(key)
    if payload is None:
        return None
    try:
        return backend.load_compiled(payload)
    except OutOfMemoryError:
        raise
    except Exception as e:
        disk.reject(key, f"{backend.name} refused it: {type(e).__name__}: {e}")
        return None


def compile_and_store(backend: Any, graph: Any, disk: DiskCache | None, key: str | None) -> Any:
    """``backend.compile`` of ``graph`` after the backend's passes (``graph`` is rewritten),
    its ``serialize()`` stored under ``key`` when there is one and it gives bytes."""
    from anychip.ir.passes import PassManager

    if backend.passes:  # one manager: the graph is verified after every pass
        PassManager(backend.passes, max_iterations=1)(graph)
    compiled = backend.compile(graph)
    if disk is not None and key is not None:
        data = _serialized(backend, compiled)
        if data is not None:
            disk.store(key, data)
        elif compiled.checked_later:
            # Checked at its first run (a background compile): stored once that check passed,
            # so a later process never loads an executable nobody checked.
            compiled.when_checked.append(lambda: _store_checked(backend, compiled, disk, key))
    return compiled


def _serialized(backend: Any, compiled: Any) -> bytes | None:
    try:
        return compiled.serialize()
    except Exception as e:
        log.warning("anychip: %s: could not serialize a partition: %s", backend.name, e)
        return None


def _store_checked(backend: Any, compiled: Any, disk: DiskCache, key: str) -> None:
    data = _serialized(backend, compiled)
    if data is not None:
        disk.store(key, data)


def compile_graph_cached(
    backend: Any, graph: Any, signature: tuple, disk: DiskCache | None
) -> tuple[Any, bool]:
    """``graph`` loaded from ``disk`` or compiled (and stored): ``(CompiledGraph, loaded)``."""
    key = cache_key(backend, disk, graph, signature)
    compiled = load_cached(backend, disk, key)
    if compiled is not None:
        return compiled, True
    return compile_and_store(backend, graph, disk, key), False
