"""The cache bound, watched while the test suite runs (issue 44: "the cache stays under its
size limit while the whole test suite runs twice").

The controller process samples the size of anychip's cache folder (``paths.cache_root()``,
links followed, as ``paths.evict`` counts it) every few seconds while the tests run, and
prints the largest size seen against ``paths.cache_limit()``. With
``ANYCHIP_TEST_CACHE_BOUND=1`` the run fails when the folder went past the limit by more than
a slack of a twentieth of the limit for what is counted only after it is written (pyopencl's
own program cache, a C library while its compiler writes it; every other write reserves its
room first: ``paths.reserve``), or ends above the limit. ``.ci/run``
runs the default and the slow tier on one cache folder with a small limit, so the second
reuses and evicts what the first stored.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

#: Seconds between two samples of the folder's size.
EVERY_S = 2.0


def folder_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` as a reservation counts them (``paths.reserve``:
    temporary files under way included), but for ``pycache``: the test run's own byte code,
    which ``tests/conftest.py`` puts there when Python may not write it beside the sources
    (Python writes it, not anychip's store). Taken under the folder's lock, so that no file
    is evicted and another stored while the walk is between folders (counted together)."""
    from anychip.paths import _FolderLock, _scan

    if not root.exists():
        return 0
    test_bytecode = str(root / "pycache")
    with _FolderLock(root):
        files, busy = _scan(root)
    sizes = [(str(p), size) for _, size, p in files] + list(busy.items())
    return sum(size for p, size in sizes if not p.startswith(test_bytecode))


class CacheWatch:
    """A pytest plugin of the controller: samples, the summary line and the check."""

    def __init__(self, root: Path, limit: int, enforce: bool) -> None:
        self.root, self.limit, self.enforce = root, limit, enforce
        self.largest = self.last = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cache-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(EVERY_S):
            self.sample()

    def sample(self) -> int:
        size = folder_bytes(self.root)
        self.largest, self.last = max(self.largest, size), size
        self.samples += 1
        return size

    def problems(self) -> list[str]:
        out = []
        if self.largest > self.limit + self.limit // 20:
            out.append(f"the cache reached {self.largest >> 20} MiB, past its limit of "
                       f"{self.limit >> 20} MiB and the slack of a twentieth")  # fmt: skip
        if self.last > self.limit:
            out.append(f"the cache ended at {self.last >> 20} MiB, above its limit")
        return out

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.sample()
        if self.enforce and self.problems():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_line(
            f"anychip cache {self.root}: largest {self.largest / 2**20:.1f} MiB, at the end "
            f"{self.last / 2**20:.1f} MiB, limit {self.limit / 2**20:.0f} MiB "
            f"({self.samples} samples)"
        )
        if self.enforce:
            for problem in self.problems():
                terminalreporter.write_line(f"FAILED cache bound: {problem}", red=True)


def register(config: pytest.Config) -> None:
    """Start the watch in the controller (not in xdist's workers)."""
    if hasattr(config, "workerinput"):
        return
    from anychip.paths import cache_limit, cache_root

    enforce = os.environ.get("ANYCHIP_TEST_CACHE_BOUND") == "1"
    config.pluginmanager.register(
        CacheWatch(cache_root(), cache_limit(), enforce), "anychip-cache-watch"
    )
