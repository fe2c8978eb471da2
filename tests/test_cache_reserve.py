"""Room reserved before a cache write (paths.reserve): several processes writing large entries
into one small cache folder never take it past its limit (issue 44: the slow tier reached
720 MiB under a 256 MiB limit), and the unit cases of the reservation."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from anychip import paths


def _disk(root: Path) -> int:
    """Every byte under ``root`` as the disk holds it: temporary files under way included, the
    store's bookkeeping (``.lock``, ``.reserved``) too (a reservation is released without
    the folder's lock: one removed under the walk counts nothing)."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


@pytest.fixture
def small(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ANYCHIP_CACHE_LIMIT", "1000")
    monkeypatch.setattr(paths, "_WAIT_S", 0.3)
    return tmp_path


def _old(path: Path, nbytes: int, when: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"o" * nbytes)
    os.utime(path, (when, when))


def test_a_reservation_evicts_the_least_recently_used_first(small) -> None:
    for i in range(4):
        _old(small / "c" / f"{i}.bin", 200, 1000 + i)  # 800 bytes, 0 the oldest
    with paths.reserve(500) as room:
        assert room
        left = sorted(p.name for p in (small / "c").iterdir())
        # 800 + 500 > 1000: down to 90% of the limit with the 500 counted
        assert left == ["2.bin", "3.bin"], left
    assert not list((small / paths._RESERVED).iterdir())  # released


def test_other_reservations_count_until_released(small) -> None:
    first = paths.reserve(600)
    assert first.__enter__()
    t0 = time.monotonic()
    with paths.reserve(600) as room:
        assert not room  # waited for the first, which held its room: not stored
    assert time.monotonic() - t0 >= 0.25
    first.__exit__(None, None, None)
    with paths.reserve(600) as room:
        assert room


def test_a_write_under_way_counts_and_is_not_evicted(small) -> None:
    busy = small / "c" / ".a.bin.1.2.tmp"
    _old(small / "c" / "old.bin", 300, 1000)
    busy.write_bytes(b"b" * 700)  # another process's write, not yet renamed
    with paths.reserve(300) as room:
        assert room  # the old file went, the write under way stayed
    assert busy.exists() and not (small / "c" / "old.bin").exists()
    with paths.reserve(400) as room:
        assert not room  # 700 under way + 400 > 1000 and nothing left to evict


def test_its_own_temporary_file_is_not_counted_twice(small) -> None:
    tmp = small / "c" / ".x.so.9.9.tmp"
    tmp.parent.mkdir()
    tmp.write_bytes(b"x" * 700)  # built first, its size known after (the C libraries)
    with paths.reserve(700, tmp=tmp) as room:
        assert room


def test_an_entry_larger_than_the_limit_is_not_stored_and_warned_once(small, caplog) -> None:
    monkeypatch_warned = paths._warned.copy()
    paths._warned.discard(str(small))
    try:
        with caplog.at_level(logging.WARNING, logger="anychip"):
            assert not paths.write_atomic(small / "c" / "big.bin", b"b" * 1001)
            assert not paths.write_atomic(small / "c" / "big2.bin", b"b" * 2000)
        assert not (small / "c" / "big.bin").exists()
        warned = [r for r in caplog.records if "larger than the cache's limit" in r.message]
        assert len(warned) == 1, caplog.text
        assert "ANYCHIP_CACHE_LIMIT" in warned[0].message
        assert paths.write_atomic(small / "c" / "ok.bin", b"k" * 900)  # runs on
    finally:
        paths._warned.clear()
        paths._warned.update(monkeypatch_warned)


def test_a_dead_process_reservation_is_dropped(small) -> None:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(proc.stdout)
    (small / paths._RESERVED).mkdir()
    (small / paths._RESERVED / f"{dead}-1-0").write_text("900\n")
    with paths.reserve(500) as room:
        assert room
    assert not (small / paths._RESERVED / f"{dead}-1-0").exists()


def test_the_bookkeeping_is_neither_counted_nor_evicted(small) -> None:
    with paths.reserve(10):
        assert (small / paths._LOCK_NAME).exists()
        assert paths.cache_info(small) == {}
        assert paths.clear_cache(small) == (0, 0)
        assert len(list((small / paths._RESERVED).iterdir())) == 1


def test_the_exclusive_file_lock_where_flock_is_missing(small, monkeypatch) -> None:
    monkeypatch.setattr(paths._FolderLock, "method", "excl")
    excl = small / f"{paths._LOCK_NAME}.excl"
    with paths._FolderLock(small):
        assert excl.exists()
    assert not excl.exists()
    excl.write_text("")
    os.utime(excl, (1, 1))  # left by a process that died: taken over
    assert paths.write_atomic(small / "a.bin", b"a" * 10)
    assert not excl.exists()


# A writer process: waits for the start file, then stores ``count`` entries of random sizes,
# half through the compiled-artifact cache (IREE's path), half through ``write_atomic``.
_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import numpy as np
    from anychip import paths
    from anychip.core.compile.cache import DiskCache

    me, count, start = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    rng = np.random.default_rng(me)
    disk = DiskCache()
    while not start.exists():
        time.sleep(0.005)
    for i in range(count):
        data = rng.bytes(int(rng.integers(300_000, 900_000)))
        if i % 2:
            disk.store(f"{me:032x}{i:032x}", data)
        else:
            paths.write_atomic(paths.cache_root() / "other" / f"{me}-{i}.bin", data)
    """
)


@pytest.mark.parametrize("lock", ["flock", "excl"])
def test_processes_writing_at_once_never_pass_the_limit(tmp_path, monkeypatch, lock) -> None:
    root, limit = tmp_path / "cache", 3 << 20
    env = dict(os.environ, ANYCHIP_CACHE_DIR=str(root), ANYCHIP_CACHE_LIMIT=str(limit))
    start = tmp_path / "start"
    root.mkdir()
    script = _WRITER
    if lock == "excl":  # the writers and the watcher below
        script = "from anychip import paths\npaths._FolderLock.method = 'excl'\n" + script
        monkeypatch.setattr(paths._FolderLock, "method", "excl")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(i), "25", str(start)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    largest, samples, stop = [0], [0], threading.Event()

    def watch() -> None:  # the folder's bytes on disk, sampled as fast as a walk allows
        while not stop.is_set():
            if root.exists():
                # Under the folder's lock: a walk is not one instant, and a file evicted after
                # the walk counted it and another stored before the walk reaches its folder
                # would be counted together (writes under way still grow meanwhile).
                with paths._FolderLock(root):
                    size = _disk(root)
                largest[0] = max(largest[0], size)
                samples[0] += 1

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start.write_text("")
    try:
        errors = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        stop.set()
        watcher.join(10)
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), errors
    assert samples[0] >= 5, samples
    # 100 writes of 0.3-0.9 MB: about 60 MB through a 3 MiB folder, never above it
    assert largest[0] <= limit, (largest[0], limit)
    assert _disk(root) <= limit
    assert len(list((root / "compiled").iterdir())) > 0


def test_a_folder_that_cannot_be_written_stores_nothing_and_raises_nothing(small) -> None:
    blocker = small / "file"
    blocker.write_text("")  # a file where the cache folder would be: no lock, no folder
    assert not paths.write_atomic(blocker / "c" / "a.bin", b"a", root=blocker)
    with paths.reserve(10, blocker) as room:
        assert not room


def test_the_ledger_spares_the_walk_while_it_has_room(small, monkeypatch) -> None:
    walks = []
    scan = paths._scan
    monkeypatch.setattr(paths, "_scan", lambda root: walks.append(root) or scan(root))
    # ``stored``'s own look (each twentieth of the limit written: 50 bytes here) is not this
    monkeypatch.setattr(paths, "stored", lambda nbytes, root=None: None)
    assert paths.write_atomic(small / "a.bin", b"a" * 100)  # no ledger yet: a walk
    assert len(walks) == 1
    assert paths.write_atomic(small / "b.bin", b"b" * 100)  # room in the ledger: none
    assert len(walks) == 1 and paths._read_ledger(small)[0] == 200
    _old(small / "by-hand.bin", 700, time.time())  # written without a reservation
    assert paths.write_atomic(small / "c.bin", b"c" * 150)  # unseen until the next walk
    assert len(walks) == 1 and paths._read_ledger(small)[0] == 350
    assert paths.write_atomic(small / "d.bin", b"d" * 700)  # no room by the ledger: a walk
    assert len(walks) == 2
    # 1,750 bytes with d: a, b, then the one written by hand evicted, down to 90%
    assert sorted(p.name for p in small.glob("*.bin")) == ["c.bin", "d.bin"]
    assert paths._read_ledger(small)[0] == 850
    monkeypatch.setattr(paths, "_WALK_EVERY_S", 0.0)  # an old ledger: walked again
    assert paths.write_atomic(small / "e.bin", b"e" * 10)
    assert len(walks) == 3 and paths._read_ledger(small)[0] == 860


def test_an_eviction_takes_its_bytes_off_the_ledger(small) -> None:
    assert paths.write_atomic(small / "a.bin", b"a" * 600)
    os.utime(small / "a.bin", (1, 1))
    assert paths.write_atomic(small / "b.bin", b"b" * 300)
    assert paths._read_ledger(small)[0] == 900
    assert paths.evict(small, limit=500) == (1, 600)
    assert paths._read_ledger(small)[0] == 300
    paths.clear_cache(small)
    assert paths._read_ledger(small) is None  # the next reservation walks
