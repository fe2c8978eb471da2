"""Where anychip keeps what it writes, and the bound on it (ground floor: imports nothing of
anychip).

One folder per user (``cache_root``): ``$ANYCHIP_CACHE_DIR``, else the platform's cache
folder from ``platformdirs`` (``~/.cache/anychip`` or ``$XDG_CACHE_HOME/anychip`` on Linux,
``~/Library/Caches/anychip`` on macOS, ``%LOCALAPPDATA%\\anychip\\Cache`` on Windows). Every
cache under it (compiled artifacts, generated C, calibration, the XPU driver, the conformance
cases) writes its files with ``write_atomic`` (or its own temporary-name-and-rename) and
reports them with ``stored``; a file read from a cache is marked ``used``. The folder is one
store bounded by ``cache_limit()`` (``ANYCHIP_CACHE_LIMIT``, default 2 GiB): after writes
adding up to a twentieth of the limit, ``evict`` removes the least recently used files (by
modification time, which ``used`` moves forward) until the folder holds 90% of the limit.
A process also keeps the folder's size as its last look found it plus what it wrote since, and
evicts as soon as that passes the limit: its own writes never leave the folder above it (what
other processes write is seen at the next look). Folders linked into the cache (a test
session's links to the user's built code, ``tests/conftest.py``) are followed, once each:
what is written through a link counts against the limit and is evicted like the rest.

Why not ``diskcache``: its values live in SQLite or in files it names and reads back itself;
anychip's caches hand files to other programs by path (cffi's ``dlopen`` of a built library,
the C compiler's output renamed into place) and already write atomically with versioned keys
in their names. What they lacked is a bound and one eviction rule over all of them, which
this module adds without a database (docs/decisions/031-what-users-expect.md).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = [
    "cache_root",
    "cache_limit",
    "write_atomic",
    "stored",
    "used",
    "evict",
    "cache_info",
    "clear_cache",
    "DEFAULT_LIMIT",
]

#: The store's size when ``ANYCHIP_CACHE_LIMIT`` does not say.
DEFAULT_LIMIT = 2 << 30
#: Eviction goes down to this share of the limit (room for the next writes).
_LOW_WATER = 0.9
#: Files younger than this, named as temporary files, are another process's write under way.
_TMP_GRACE_S = 3600
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_lock = threading.Lock()
#: Per cache folder: (bytes written since the last look, or -1 before the first; the
#: folder's bytes as that look left them plus what was written since).
_written: dict[str, tuple[int, int]] = {}


def cache_root() -> Path:
    """``$ANYCHIP_CACHE_DIR``, else the platform's user cache folder for anychip."""
    if os.environ.get("ANYCHIP_CACHE_DIR"):
        return Path(os.environ["ANYCHIP_CACHE_DIR"]).expanduser()
    try:
        import platformdirs
    except ImportError:  # a copy run without its dependencies: the XDG rule by hand
        xdg = os.environ.get("XDG_CACHE_HOME")
        return (Path(xdg) if xdg else Path.home() / ".cache") / "anychip"
    return Path(platformdirs.user_cache_dir("anychip", appauthor=False))


def cache_limit() -> int:
    """``ANYCHIP_CACHE_LIMIT`` in bytes (``500M``, ``2G``, or a number), else 2 GiB."""
    raw = os.environ.get("ANYCHIP_CACHE_LIMIT", "").strip().upper().removesuffix("B")
    if not raw:
        return DEFAULT_LIMIT
    unit = raw[-1] if raw[-1] in _UNITS else ""
    try:
        return max(0, int(float(raw[: len(raw) - len(unit)]) * _UNITS[unit]))
    except ValueError:
        from anychip.errors import AnychipError

        raise AnychipError(
            f"ANYCHIP_CACHE_LIMIT={os.environ['ANYCHIP_CACHE_LIMIT']!r} is not a size "
            "(a number of bytes, or with K, M, G: 500M, 2G)"
        ) from None


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` under a temporary name renamed into place (readers never
    see half a file), then count it with ``stored``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    stored(len(data))


def used(path: Path) -> None:
    """Mark a cache file as just used (its modification time: the LRU order)."""
    try:
        os.utime(path)
    except OSError:
        pass


def stored(nbytes: int, root: Path | None = None) -> None:
    """Count ``nbytes`` written under ``root`` (the cache folder); ``evict`` when the folder
    would be past the limit, and past a twentieth of the limit written since the last look
    (other processes write into the folder too)."""
    root = root or cache_root()
    key = str(root)
    limit = cache_limit()
    with _lock:
        since, size = _written.get(key, (-1, 0))
        due = since < 0 or since + nbytes >= limit // 20 or size + nbytes > limit
        _written[key] = (0 if due else since + nbytes, size + nbytes)
    if due:
        _, _, left = _evict(root, limit)
        with _lock:
            since, _ = _written[key]
            _written[key] = (since, left + since)  # what other threads wrote meanwhile


def _files(root: Path) -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of every file under ``root``, temporary files under way left out;
    linked folders followed, each real folder walked once."""
    now = time.time()
    out = []
    seen: set[str] = set()
    for dirpath, dirnames, names in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a link back up, or two links to one folder
            dirnames[:] = []
            continue
        seen.add(real)
        for name in names:
            p = Path(dirpath) / name
            try:
                st = p.stat()
            except OSError:
                continue  # removed meanwhile
            if name.endswith(".tmp") and now - st.st_mtime < _TMP_GRACE_S:
                continue
            out.append((st.st_mtime, st.st_size, p))
    return out


def evict(root: Path | None = None, limit: int | None = None) -> tuple[int, int]:
    """Remove the least recently used files until ``root`` holds at most 90% of ``limit``
    (when it holds more than ``limit``); returns (files, bytes) removed."""
    removed, freed, _ = _evict(root or cache_root(), cache_limit() if limit is None else limit)
    return removed, freed


def _evict(root: Path, limit: int) -> tuple[int, int, int]:
    """``evict``'s work; also returns the bytes the folder holds after it."""
    files = _files(root)
    total = sum(size for _, size, _ in files)
    if total <= limit:
        return 0, 0, total
    removed = freed = 0
    for _, size, p in sorted(files, key=lambda f: f[0]):
        if total - freed <= limit * _LOW_WATER:
            break
        try:
            p.unlink()
        except OSError:
            continue
        removed, freed = removed + 1, freed + size
    return removed, freed, total - freed


def cache_info(root: Path | None = None) -> dict[str, tuple[int, int]]:
    """Files and bytes per top folder of the cache (``anychip cache info``)."""
    root = root or cache_root()
    out: dict[str, tuple[int, int]] = {}
    for _, size, p in _files(root):
        rel = p.relative_to(root).parts
        top = rel[0] if len(rel) > 1 else "."
        files, nbytes = out.get(top, (0, 0))
        out[top] = (files + 1, nbytes + size)
    return dict(sorted(out.items()))


def clear_cache(root: Path | None = None) -> tuple[int, int]:
    """Remove every file of the cache (``anychip cache clear``); returns (files, bytes)."""
    return evict(root or cache_root(), limit=-1)
