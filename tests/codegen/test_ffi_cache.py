"""``codegen/ffi.declare``: cffi declarations parsed by the first process, imported by the
next, never imported from a file another user could have written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CDEF = "int anychip_test_add(int a, int b); typedef struct { float x; double y; } pair_t;"

_CHILD = """
import sys, cffi
from anychip.codegen import ffi as F
parsed = []
real = cffi.FFI.cdef
def counting(self, *a, **k):
    parsed.append(1)
    return real(self, *a, **k)
cffi.FFI.cdef = counting
made = F.declare(sys.argv[1])
lib = made.dlopen(None)  # the process itself: libc's abs through the declarations
assert made.sizeof("pair_t") == 16, made.sizeof("pair_t")
assert made.typeof("int(*)(int, int)") is not None
print("parsed" if parsed else "imported")
"""


def _child(tmp: Path, cdef: str = CDEF) -> str:
    env = dict(os.environ, ANYCHIP_COMPILE_CACHE="1", ANYCHIP_CODEGEN_CACHE_DIR=str(tmp))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, cdef], env=env, capture_output=True, text=True,
        timeout=120, cwd=str(Path(__file__).resolve().parents[2].parent),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "generating" not in done.stdout  # cffi's emitter prints; it must not reach users
    return done.stdout.strip()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "codegen"


def test_the_second_process_imports_what_the_first_parsed(folder: Path) -> None:
    assert _child(folder) == "parsed"
    (module,) = (folder / "ffi").glob("_anychip_ffi_*.py")
    assert module.stat().st_mode & 0o022 == 0
    assert _child(folder) == "imported"
    assert _child(folder, CDEF + " int anychip_other(void);") == "parsed"  # another text


def test_a_file_others_can_write_is_never_imported(folder: Path) -> None:
    _child(folder)
    (module,) = (folder / "ffi").glob("_anychip_ffi_*.py")
    module.write_text("raise SystemExit('imported a foreign file')\n")
    os.chmod(module, 0o666)
    assert _child(folder) == "parsed"


def test_a_damaged_file_is_parsed_again_and_rewritten(folder: Path) -> None:
    _child(folder)
    (module,) = (folder / "ffi").glob("_anychip_ffi_*.py")
    module.write_text("this is not python (\n")
    assert _child(folder) == "parsed"
    assert _child(folder) == "imported"
