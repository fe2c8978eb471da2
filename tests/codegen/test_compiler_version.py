"""The compiler's version kept per compiler binary (``codegen/build.py``): a new process asks
no compiler while the binary is the same; a replaced or upgraded binary is asked again."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from anychip.codegen import build


def _compiler(path: Path, version: str, calls: Path) -> None:
    path.write_text(f"#!/bin/sh\necho x >> {calls}\necho '{version}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def fake_cc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path]:
    cc, calls = tmp_path / "fakecc", tmp_path / "calls"
    _compiler(cc, "fakecc 1.0", calls)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("ANYCHIP_CODEGEN_CACHE_DIR", str(tmp_path / "codegen"))
    monkeypatch.setattr(build, "_compiler", {})
    return cc, calls


def _asked(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def _new_process() -> None:
    build._compiler.clear()  # what a fresh process starts with


def test_asked_once_per_binary(fake_cc: tuple[Path, Path]) -> None:
    cc, calls = fake_cc
    assert build.compiler() == (str(cc), "fakecc 1.0")
    _new_process()
    assert build.compiler() == (str(cc), "fakecc 1.0")
    assert _asked(calls) == 1


def test_a_replaced_compiler_is_asked_again(fake_cc: tuple[Path, Path]) -> None:
    cc, calls = fake_cc
    assert build.compiler() == (str(cc), "fakecc 1.0")
    _compiler(cc, "fakecc 2.0 (upgraded)", calls)
    st = cc.stat()
    os.utime(cc, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _new_process()
    assert build.compiler() == (str(cc), "fakecc 2.0 (upgraded)")
    assert _asked(calls) == 2


def test_a_damaged_record_is_asked_again(fake_cc: tuple[Path, Path], tmp_path: Path) -> None:
    cc, calls = fake_cc
    build.compiler()
    (record,) = (tmp_path / "codegen").glob("cc-*.txt")
    record.write_text("something else\n")
    _new_process()
    assert build.compiler() == (str(cc), "fakecc 1.0")
    assert _asked(calls) == 2
