"""The suite's cache watch (tests/cache_watch.py) reports a folder past its limit."""

from __future__ import annotations

from pathlib import Path

from tests.cache_watch import CacheWatch


def _watch(root: Path, limit: int) -> CacheWatch:
    w = CacheWatch(root, limit, enforce=True)
    w._stop.set()  # no background samples: the test samples itself
    w._thread.join()
    return w


def test_a_folder_within_its_limit_passes(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 1000)
    w = _watch(tmp_path, 2000)
    assert w.sample() == 1000
    assert w.problems() == []


def test_a_folder_past_its_limit_fails_with_the_sizes(tmp_path: Path) -> None:
    sub = tmp_path / "compiled"
    sub.mkdir()
    (sub / "a").write_bytes(b"x" * (3 << 20))
    w = _watch(tmp_path, 2 << 20)
    w.sample()
    problems = w.problems()
    assert len(problems) == 2 and "3 MiB" in problems[0] and "limit of 2 MiB" in problems[0]
    (sub / "a").unlink()  # evicted later: the largest size seen still fails the run
    w.sample()
    assert len(w.problems()) == 1


def test_one_write_of_slack_for_several_processes(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 1040)
    w = _watch(tmp_path, 1000)
    w.sample()
    (tmp_path / "a").write_bytes(b"x" * 900)
    w.sample()
    assert w.problems() == []  # 4% over for a moment, under at the end


def test_the_test_runs_byte_code_is_not_anychips_store(tmp_path: Path) -> None:
    (tmp_path / "pycache").mkdir()
    (tmp_path / "pycache" / "m.pyc").write_bytes(b"x" * 5000)
    (tmp_path / "calibration.json").write_bytes(b"x" * 100)
    assert _watch(tmp_path, 1000).sample() == 100


def test_writes_under_way_count_the_stores_bookkeeping_does_not(tmp_path: Path) -> None:
    (tmp_path / "compiled").mkdir()
    (tmp_path / "compiled" / "k.123.456.tmp").write_bytes(b"x" * 700)  # a write not yet renamed
    (tmp_path / "a.bin").write_bytes(b"x" * 100)
    (tmp_path / ".reserved").mkdir()
    (tmp_path / ".reserved" / "1-2-3").write_text("900\n")
    assert _watch(tmp_path, 1000).sample() == 800
