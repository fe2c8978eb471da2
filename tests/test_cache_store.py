"""The one cache folder and its bound (paths.py): LRU eviction under ANYCHIP_CACHE_LIMIT,
what every cache writes counted, ``anychip cache info|clear``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from anychip import paths
from anychip.cli.main import main
from anychip.core.compile.cache import DiskCache
from anychip.errors import AnychipError


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_the_store_stays_under_its_limit_and_keeps_what_is_used(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ANYCHIP_CACHE_LIMIT", "64K")
    disk = DiskCache()
    rng = np.random.default_rng(0)
    keys = [f"{i:064x}" for i in range(40)]
    for i, key in enumerate(keys):
        disk.store(key, rng.bytes(6000))
        assert _size(tmp_path) <= 64 << 10, (i, _size(tmp_path))
        assert disk.load(keys[0]) is not None, i  # used after every write: never evicted
    assert disk.stats["rejected"] == 0
    assert disk.load(keys[1]) is None  # the least recently used went first
    assert disk.load(keys[-1]) is not None


def test_the_limit_and_the_folder_from_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ANYCHIP_CACHE_LIMIT", "500M")
    assert paths.cache_limit() == 500 << 20
    monkeypatch.setenv("ANYCHIP_CACHE_LIMIT", "lots")
    with pytest.raises(AnychipError, match="ANYCHIP_CACHE_LIMIT='lots' is not a size"):
        paths.cache_limit()
    monkeypatch.delenv("ANYCHIP_CACHE_LIMIT")
    assert paths.cache_limit() == paths.DEFAULT_LIMIT
    monkeypatch.delenv("ANYCHIP_CACHE_DIR", raising=False)
    if sys.platform.startswith("linux"):  # platformdirs follows XDG there
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        assert paths.cache_root() == tmp_path / "anychip"
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "mine"))
    assert paths.cache_root() == tmp_path / "mine"


def test_a_write_under_way_is_never_evicted(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    old, busy = tmp_path / "a" / "old.bin", tmp_path / "a" / ".x.bin.1.2.tmp"
    old.write_bytes(b"0" * 3000)
    busy.write_bytes(b"1" * 3000)
    os.utime(old, (1, 1))
    assert paths.evict(tmp_path, limit=1000) == (1, 3000)
    assert busy.exists() and not old.exists()


def test_cache_info_and_clear(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    paths.write_atomic(tmp_path / "codegen" / "a.so", b"x" * 100)
    paths.write_atomic(tmp_path / "calibration" / "cpu.json", b"{}")
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["folder"] == str(tmp_path) and info["bytes"] == 102
    assert info["caches"]["codegen"] == {"files": 1, "bytes": 100}
    assert main(["cache", "clear"]) == 0
    assert "removed 2 file(s)" in capsys.readouterr().out
    assert _size(tmp_path) == 0
