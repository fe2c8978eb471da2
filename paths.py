"""Where anychip keeps what it writes, and the bound on it (ground floor: imports nothing of
anychip but ``folder_lock``).

One folder per user (``cache_root``): ``$ANYCHIP_CACHE_DIR``, else the platform's cache
folder from ``platformdirs`` (``~/.cache/anychip`` or ``$XDG_CACHE_HOME/anychip`` on Linux,
``~/Library/Caches/anychip`` on macOS, ``%LOCALAPPDATA%\\anychip\\Cache`` on Windows). Every
cache under it (compiled artifacts, generated C, calibration, the XPU driver, the conformance
cases) writes its files with ``write_atomic`` (or its own temporary-name-and-rename inside a
``reserve``) and reports them with ``stored``; a file read from a cache is marked ``used``.
The folder is one store bounded by ``cache_limit()`` (``ANYCHIP_CACHE_LIMIT``, default
2 GiB): after writes adding up to a twentieth of the limit, ``evict`` removes the least
recently used files (by modification time, which ``used`` moves forward) until the folder
holds 90% of the limit. A process also keeps the folder's size as its last look found it plus
what it wrote since, and evicts as soon as that passes the limit.

Several processes (pytest-xdist's workers, a user's parallel jobs) write into one folder, each
knowing only its own writes; counting after the fact let three of them writing IREE's 100 MB
artifacts at once take a 256 MiB folder to 720 MiB. So a writer first reserves (``reserve``)
what it is about to write: under a lock file shared by every process (``.lock`` in the
folder, ``folder_lock.py``: ``fcntl.flock``, ``msvcrt.locking`` on Windows, else a file
created exclusively), the reservation looks at the folder afresh (temporary files under way
included), adds the other processes' reservations not yet on disk, and evicts least recently
used files until size + reservations + its own bytes fit under the limit; it then records
itself in ``.reserved/`` until the write is renamed into place. The look is a walk at most
every ten seconds: in between, a ledger (``.size``) that every reservation adds to and every
eviction takes from, trusted while it has room. When the others' writes under way leave no
room it waits for them (``_WAIT_S``), then gives up: the entry is not stored. An entry
larger than the limit itself is never stored (warned once a process). A process that dies
leaves a reservation its successors drop (its process id is gone, or it is older than an
hour). Folders linked into the cache (a test session's links to the user's built code,
``tests/conftest.py``) are followed, once each: what is written through a link counts
against the limit and is evicted like the rest.

Why not ``diskcache``: its values live in SQLite or in files it names and reads back itself;
anychip's caches hand files to other programs by path (cffi's ``dlopen`` of a built library,
the C compiler's output renamed into place) and already write atomically with versioned keys
in their names. What they lacked is a bound and one eviction rule over all of them, which
this module adds without a database (docs/decisions/031-what-users-expect.md; the
reservation: docs/decisions/051-cache-reservations.md).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from pathlib import Path
from types import TracebackType

from anychip.folder_lock import LOCK_NAME
from anychip.folder_lock import FolderLock as _FolderLock

__all__ = [
    "cache_root",
    "cache_limit",
    "write_atomic",
    "reserve",
    "Reservation",
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
#: How long a reservation waits for other processes' writes under way to leave it room.
_WAIT_S = 120.0
#: The store's own bookkeeping in the cache folder: never counted, never evicted.
_LOCK_NAME, _RESERVED, _LEDGER = LOCK_NAME, ".reserved", ".size"
_BOOKKEEPING = frozenset({_LOCK_NAME, f"{_LOCK_NAME}.excl", _LEDGER})
#: A reservation trusts the ledger (the folder's bytes as the last walk found them, plus
#: every reservation since) for this long; then, or when it says there is no room, it walks.
_WALK_EVERY_S = 10.0
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_lock = threading.Lock()
#: Per cache folder: (bytes written since the last look, or -1 before the first; the
#: folder's bytes as that look left them plus what was written since).
_written: dict[str, tuple[int, int]] = {}
_ids = itertools.count()
_warned: set[str] = set()
log = logging.getLogger("anychip")


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


def write_atomic(path: Path, data: bytes, root: Path | None = None) -> bool:
    """Write ``data`` to ``path`` under a temporary name renamed into place (readers never
    see half a file), room for it reserved first (``reserve``), then count it with ``stored``.

    Returns:
        False when the store kept no room for it (larger than the limit, or other writes
        under way): nothing was written.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with reserve(len(data), root, tmp) as room:
        if not room:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    stored(len(data), root)
    return True


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


def _under_way(name: str) -> bool:
    """A file some writer has not renamed into place yet (``*.tmp``; the C builds'
    ``.build-*``)."""
    return name.endswith(".tmp") or name.startswith(".build-")


def _scan(root: Path) -> tuple[list[tuple[float, int, Path]], dict[str, int]]:
    """(mtime, size, path) of every file under ``root`` that may be evicted, and the sizes of
    the temporary files under way (by path; younger than an hour); linked folders followed,
    each real folder walked once; the store's ``.lock`` and ``.reserved/`` left out."""
    now = time.time()
    out = []
    busy: dict[str, int] = {}
    seen: set[str] = set()
    for dirpath, dirnames, names in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a link back up, or two links to one folder
            dirnames[:] = []
            continue
        seen.add(real)
        top = dirpath == str(root)
        if top and _RESERVED in dirnames:
            dirnames.remove(_RESERVED)
        for name in names:
            if top and name in _BOOKKEEPING:
                continue
            p = Path(dirpath) / name
            try:
                st = p.stat()
            except OSError:
                continue  # removed meanwhile
            if _under_way(name) and now - st.st_mtime < _TMP_GRACE_S:
                busy[str(p)] = st.st_size
                continue
            out.append((st.st_mtime, st.st_size, p))
    return out, busy


def _files(root: Path) -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of every file under ``root``, temporary files under way left out;
    linked folders followed, each real folder walked once."""
    return _scan(root)[0]


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (POSIX; elsewhere assumed, and age decides)."""
    if os.name != "posix" or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _reserved(root: Path, skip: Path | None = None) -> int:
    """Bytes the reservations in ``root/.reserved`` (but ``skip``) still have to write: each
    one's size less what its temporary file already holds (counted by ``_scan``). Those of
    dead processes, or older than an hour, are removed. Called under the folder's lock."""
    folder = root / _RESERVED
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    now = time.time()
    pending = 0
    for entry in entries:
        if skip is not None and entry.path == str(skip):
            continue
        try:
            nbytes_text, _, tmp = Path(entry.path).read_text().partition("\n")
            pid = int(entry.name.split("-")[0])
            stale = now - entry.stat().st_mtime > _TMP_GRACE_S or not _alive(pid)
            nbytes = int(nbytes_text)
        except (OSError, ValueError):
            continue  # half written (it is written before it is named) or just removed
        if stale:
            Path(entry.path).unlink(missing_ok=True)
            continue
        try:
            written = os.path.getsize(tmp) if tmp else 0
        except OSError:
            written = 0  # not begun, or renamed into place (then counted twice: briefly)
        pending += max(0, nbytes - written)
    return pending


class Reservation:
    """Room for one write in the cache folder, held from ``__enter__`` (which evicts what it
    must and returns whether the write may go ahead) until ``__exit__``. Use ``reserve``."""

    def __init__(self, root: Path, nbytes: int, tmp: Path | None) -> None:
        self.root, self.nbytes, self.tmp = root, max(0, nbytes), tmp
        self.granted = False
        self._file: Path | None = None

    def __enter__(self) -> bool:
        self.granted = self._claim()
        return self.granted

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.unlink(missing_ok=True)
            self._file = None

    def _claim(self) -> bool:
        limit = cache_limit()
        if self.nbytes > limit:
            key = str(self.root)
            if key not in _warned:
                _warned.add(key)
                log.warning(
                    "anychip: a cache entry of %.1f MiB is larger than the cache's limit of "
                    "%.1f MiB (ANYCHIP_CACHE_LIMIT): not stored, so it is built again next "
                    "time; raise ANYCHIP_CACHE_LIMIT to keep such entries",
                    self.nbytes / 2**20,
                    limit / 2**20,
                )
            return False
        deadline = time.monotonic() + _WAIT_S
        name = f"{os.getpid()}-{threading.get_ident()}-{next(_ids)}"
        while True:
            try:
                with _FolderLock(self.root):
                    if self._fits(limit):
                        folder = self.root / _RESERVED
                        folder.mkdir(exist_ok=True)
                        tmp = folder / f".{name}"  # named once whole: never parsed half
                        tmp.write_text(f"{self.nbytes}\n{self.tmp or ''}")
                        self._file = folder / name
                        os.replace(tmp, self._file)
                        return True
            except OSError as e:  # a read-only or full folder: the write would fail too
                log.info("anychip: cache folder %s not writable (%s): not stored", self.root, e)
                return False
            if time.monotonic() > deadline:
                log.info(
                    "anychip: no room in the cache for %.1f MiB after %.0f s (other processes' "
                    "writes under way): not stored",
                    self.nbytes / 2**20,
                    _WAIT_S,
                )
                return False
            time.sleep(0.05)

    def _fits(self, limit: int) -> bool:
        """Evict least recently used files until the folder, the others' reservations and
        this write fit under ``limit`` (down to 90% of it once eviction starts); whether they
        fit. Under the folder's lock.

        The walk (200 ms over 6,600 files) is skipped while the ledger is younger than
        ``_WALK_EVERY_S`` and has room: every reservation adds its bytes to it (all of them,
        a write that fails or is smaller is counted until the next walk), every eviction takes
        its bytes off. What is written without a reservation (pyopencl's binaries) is seen at
        the next walk."""
        ledger = _read_ledger(self.root)
        if ledger is not None and time.time() - ledger[1] < _WALK_EVERY_S:
            if ledger[0] + self.nbytes <= limit:
                _write_ledger(self.root, ledger[0] + self.nbytes, ledger[1])
                return True
        # The reservations before the folder: their writes go on meanwhile (without the lock),
        # and a temporary file that grows (or is renamed) between the two looks is then
        # counted twice, never missed: read after the walk, the walk's empty file and the
        # reservation's full one would both count nothing.
        pending = _reserved(self.root)
        files, busy = _scan(self.root)
        mine = busy.get(str(self.tmp), 0) if self.tmp is not None else 0
        total = sum(size for _, size, _ in files) + sum(busy.values())
        need = total + pending + max(0, self.nbytes - mine)
        if need > limit:
            for _, size, p in sorted(files, key=lambda f: f[0]):
                if need <= limit * _LOW_WATER:
                    break
                try:
                    p.unlink()
                except OSError:
                    continue
                need -= size
                total -= size
        fits = need <= limit
        _write_ledger(self.root, need if fits else need - max(0, self.nbytes - mine), time.time())
        if fits:
            with _lock:  # ``stored``'s running count starts from this look
                _written[str(self.root)] = (0, total)
        return fits


def _read_ledger(root: Path) -> tuple[int, float] | None:
    """(bytes, when walked) from ``root/.size``, or None (none, or unreadable: walk)."""
    try:
        nbytes, walked = (root / _LEDGER).read_text().split()
        return int(nbytes), float(walked)
    except (OSError, ValueError):
        return None


def _write_ledger(root: Path, nbytes: int, walked: float) -> None:
    """Under the folder's lock (a reader never sees it half written but after a crash:
    then it does not parse, and the next reservation walks)."""
    try:
        (root / _LEDGER).write_text(f"{max(0, nbytes)} {walked!r}")
    except OSError:
        pass


def reserve(nbytes: int, root: Path | None = None, tmp: Path | None = None) -> Reservation:
    """Room for ``nbytes`` about to be written under ``root`` (the cache folder), as a
    context manager: its value says whether to write (False: larger than the limit, or no room
    left by other processes' writes under way); ``tmp`` is the temporary file the write goes
    to, when it is known (what it already holds is not counted twice). Release it once the
    file is renamed into place, then ``stored`` it:

    >>> with reserve(len(data), root, tmp) as room:  # doctest: +SKIP
    ...     if room:
    ...         tmp.write_bytes(data)
    ...         os.replace(tmp, path)
    """
    return Reservation(root or cache_root(), nbytes, tmp)


def evict(root: Path | None = None, limit: int | None = None) -> tuple[int, int]:
    """Remove the least recently used files until ``root`` holds at most 90% of ``limit``
    (when it holds more than ``limit``); returns (files, bytes) removed."""
    removed, freed, _ = _evict(root or cache_root(), cache_limit() if limit is None else limit)
    return removed, freed


def _evict(root: Path, limit: int) -> tuple[int, int, int]:
    """``evict``'s work, under the folder's lock; also returns the bytes the folder holds
    after it."""
    if not root.exists():
        return 0, 0, 0
    with _FolderLock(root):
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
        ledger = _read_ledger(root)
        if ledger is not None and freed:
            _write_ledger(root, ledger[0] - freed, ledger[1])
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
    root = root or cache_root()
    removed = evict(root, limit=-1)
    with _FolderLock(root) if root.exists() else contextlib.nullcontext():
        (root / _LEDGER).unlink(missing_ok=True)  # the next reservation walks
    return removed
