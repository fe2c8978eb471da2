"""The import rules of DESIGN.md's layout, read from the sources with ``ast`` (so an import inside
a function, or under ``TYPE_CHECKING``, counts as much as one at the top): ``ir`` imports no
``core``, ``backends``, ``viz`` or ``cli``; ``core`` imports no ``viz``; no backend imports
another backend's package."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the repository root is the ``anychip`` package

#: Backend pairs DESIGN.md itself puts one on the other, with the reason.
ALLOWED_BETWEEN_BACKENDS = {
    # "cuda/: CuPy over the array-API kernel family (arrayapi/)": arrayapi is not a plugin of
    # its own but the kernels cuda runs (backends/arrayapi/__init__.py says so).
    ("cuda", "arrayapi"),
}


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _imported(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every module ``path`` imports: ``import a.b``, ``from a.b
    import c`` (as ``a.b`` and ``a.b.c``: ``c`` may be a module) and
    ``importlib.import_module("a.b")`` with a constant name."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value))
    return out


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_reader_sees_every_form_of_import(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import anychip.viz.html\n"
        "from anychip import viz\n"
        "def f():\n"
        "    from anychip.backends.cpu.kernels import op_conv\n"
        "    importlib.import_module('anychip.viz.terminal')\n"
    )
    names = [n for _, n in _imported(src)]
    assert "anychip.viz.html" in names and "anychip.viz" in names
    assert "anychip.backends.cpu.kernels" in names and "anychip.viz.terminal" in names


def _found(folder: str, bad: Callable[[Path, str], bool]) -> str:
    """``file:line: name`` of each import under ``folder`` that ``bad(path, name)`` says breaks
    the rule, one per line of source; "" when none does."""
    found: dict[str, str] = {}
    for p in _modules(folder):
        for line, name in _imported(p):
            if bad(p, name):
                found.setdefault(f"{p.relative_to(ROOT)}:{line}", name)
    return "\n".join(f"{where}: {name}" for where, name in sorted(found.items()))


@pytest.mark.parametrize(
    "upper", ["anychip.core", "anychip.backends", "anychip.viz", "anychip.cli"]
)
def test_ir_imports_no_upper_layer(upper: str) -> None:
    found = _found("ir", lambda p, name: _under(name, upper))
    assert not found, f"ir/ must not import {upper}:\n{found}"


def test_core_imports_no_viz() -> None:
    found = _found("core", lambda p, name: _under(name, "anychip.viz"))
    assert not found, (
        "core/ must not import viz (viz registers its views with core/report/render.py):\n" + found
    )


def test_no_backend_imports_another_backend() -> None:
    backends = {p.name for p in (ROOT / "backends").iterdir() if (p / "__init__.py").exists()}
    assert {"cpu", "opencl", "cuda", "arrayapi", "xpu_stub", "npu_stub"} <= backends

    def other_backend(path: Path, name: str) -> bool:
        a = path.relative_to(ROOT / "backends").parts[0]
        parts = name.split(".")
        if parts[:2] != ["anychip", "backends"] or len(parts) < 3:
            return False
        b = parts[2]
        return b != a and b in backends and (a, b) not in ALLOWED_BETWEEN_BACKENDS

    found = _found("backends", other_backend)
    assert not found, (
        "a backend imports another backend's package (shared fusions belong in "
        "ir/passes/patterns, shared op semantics in ir/):\n" + found
    )
