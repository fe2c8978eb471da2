"""The test run's bytecode cache drops the mirrors of folders that are gone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.pycache_prune import prune

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the prefix mirrors / on POSIX only")


def _mirror(root: Path, source: Path) -> Path:
    folder = root / source.relative_to("/")
    folder.mkdir(parents=True)
    (folder / "m.cpython-311.pyc").write_bytes(b"pyc")
    return folder


def test_prune_keeps_live_folders_and_drops_gone_ones(tmp_path: Path) -> None:
    live = tmp_path / "src" / "live"
    live.mkdir(parents=True)
    gone = tmp_path / "src" / "gone" / "deep"
    root = tmp_path / "cache"
    kept = _mirror(root, live)
    dropped = _mirror(root, gone)
    assert prune(root) == 1
    assert (kept / "m.cpython-311.pyc").is_file()
    assert not dropped.exists()
    assert not dropped.parent.exists()  # the topmost gone folder goes, not only its leaf


def test_prune_of_a_missing_root_does_nothing(tmp_path: Path) -> None:
    assert prune(tmp_path / "absent") == 0
