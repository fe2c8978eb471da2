"""An exclusive lock over a folder, for every process and thread (ground floor: imports
nothing of anychip). The bounded cache store (``paths.py``) takes it around its accounting:
``with FolderLock(root): ...``."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["FolderLock", "LOCK_NAME"]

#: The lock file in the folder (and ``<LOCK_NAME>.excl`` where file locks do not work).
LOCK_NAME = ".lock"
#: Serializes this process's threads before they take the lock file.
_threads = threading.Lock()


class FolderLock:
    """The cache folder's lock, exclusive across processes and this process's threads: an
    ``flock`` (POSIX) or ``msvcrt.locking`` (Windows) on ``<root>/.lock``; where neither
    works (some network file systems), ``<root>/.lock.excl`` created exclusively, taken over
    when older than a minute (its holder died)."""

    #: "flock", "msvcrt" or "excl"; tests force "excl" to run the fallback.
    method = "flock" if os.name == "posix" else "msvcrt" if os.name == "nt" else "excl"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fd = -1
        self._how = ""

    def __enter__(self) -> FolderLock:
        _threads.acquire()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._how = self._acquire()
        except BaseException:
            _threads.release()
            raise
        return self

    def _acquire(self) -> str:
        if self.method != "excl":
            fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                if self.method == "flock":
                    import fcntl

                    fcntl.flock(fd, fcntl.LOCK_EX)
                else:
                    import msvcrt

                    while True:  # LK_LOCK gives up after 10 s: try again
                        try:
                            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)  # type: ignore[attr-defined]
                            break
                        except OSError:
                            continue
                self._fd = fd
                return self.method
            except OSError:  # no locks on this file system: the exclusive file below
                os.close(fd)
        excl = self.root / f"{LOCK_NAME}.excl"
        while True:
            try:
                os.close(os.open(excl, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
                return "excl"
            except FileExistsError:
                try:
                    if time.time() - excl.stat().st_mtime > 60:
                        excl.unlink(missing_ok=True)  # its holder died
                except OSError:
                    pass
                time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        try:
            if self._how == "excl":
                (self.root / f"{LOCK_NAME}.excl").unlink(missing_ok=True)
            elif self._fd >= 0:
                if self._how == "flock":
                    import fcntl

                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                else:
                    import msvcrt

                    os.lseek(self._fd, 0, os.SEEK_SET)
                    msvcrt.locking(self._fd, msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]
                os.close(self._fd)
                self._fd = -1
        finally:
            _threads.release()
