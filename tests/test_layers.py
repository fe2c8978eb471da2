"""The layers hold: a module imports only what its layer may (``docs/architecture.md``).

Every ``anychip`` import in the package's source is read with ``ast`` (imports under
``if TYPE_CHECKING:`` are annotations, not dependencies, and are left out) and checked
against ``RULES``: every rule whose folder holds the module must allow it; a rule decides by
the longest matching prefix of the imported name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (folder, forbidden prefixes, allowed exceptions): the longest matching prefix of an
#: imported name wins, so an exception may reopen part of a forbidden prefix.
_CORE_ABOVE_PLUGIN = ("anychip.core.plan", "anychip.core.compile", "anychip.core.run")
_OUTSIDE = ("anychip.viz", "anychip.cli", "anychip.conformance", "anychip.integrations")
RULES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    # the ground floor: the IR, the schemas and the code generator know no runtime
    ("ir", ("anychip.core", "anychip.backends", *_OUTSIDE), ()),
    ("opsets", ("anychip.core", "anychip.backends", "anychip.ir", *_OUTSIDE), ()),
    ("codegen", ("anychip.core", "anychip.backends", "anychip.ir.passes", *_OUTSIDE), ()),
    # core: no viz, no backend; inside it, each layer imports only the ones below it
    # (plugin < memory < plan < run < compile < report < api)
    (
        "core/memory",
        ("anychip.core.plugin", *_CORE_ABOVE_PLUGIN, "anychip.core.report", "anychip.core.api"),
        (),
    ),
    (
        "core/plugin",
        (*_CORE_ABOVE_PLUGIN, "anychip.core.report", "anychip.core.api"),
        (),
    ),
    ("core/plan", ("anychip.core.compile", "anychip.core.run", "anychip.core.report"), ()),
    ("core/run", ("anychip.core.compile", "anychip.core.report", "anychip.core.api"), ()),
    ("core/compile", ("anychip.core.report", "anychip.core.api"), ()),
    ("core/report", ("anychip.core.api",), ()),
    ("core", ("anychip.backends", *_OUTSIDE), ()),
    # backends: core's contract (plugin hooks and Backend, memory pools, the run-time
    # context a kernel is handed) and ir/opsets/codegen; never another backend
    (
        "backends/cuda",
        ("anychip.core", "anychip.backends", *_OUTSIDE),
        ("anychip.core.plugin", "anychip.core.memory", "anychip.core.run", "anychip.backends.cuda")
        # CUDA is the array-API kernel family run on CuPy (the design's "cuda/ on arrayapi/")
        + ("anychip.backends.arrayapi",),
    ),
    *[
        (
            f"backends/{name}",
            ("anychip.core", "anychip.backends", *_OUTSIDE),
            (
                "anychip.core.plugin",
                "anychip.core.memory",
                "anychip.core.run",
                f"anychip.backends.{name}",
            ),
        )
        for name in sorted(
            p.name for p in (ROOT / "backends").iterdir() if (p / "__init__.py").exists()
        )
        if name != "cuda"
    ],
]


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of each runtime ``anychip`` import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for b in node.body for n in ast.walk(b))
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("anychip"):
                found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("anychip")]
        elif (  # importlib.import_module("anychip.x") with a constant name
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("anychip")
        ):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def _allowed(name: str, forbidden: tuple[str, ...], allowed: tuple[str, ...]) -> bool:
    def match(prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    hits = [(len(p), True) for p in allowed if match(p)]
    hits += [(len(p), False) for p in forbidden if match(p)]
    return max(hits)[1] if hits else True


def _violations() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        rules = [r for r in RULES if rel.startswith(r[0] + "/")]
        for line, name in _imports(path) if rules else ():
            for folder, forbidden, allowed in rules:
                if not _allowed(name, forbidden, allowed):
                    out.append(f"{rel}:{line} imports {name} ({folder}/ may not)")
    return out


def test_the_reader_sees_every_form_of_import(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import anychip.viz.html\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from anychip.core.api import session\n"
        "def f():\n"
        "    from anychip.backends.cpu.kernels import op_conv\n"
        "    importlib.import_module('anychip.viz.terminal')\n"
    )
    names = [n for _, n in _imports(src)]
    assert names == [
        "anychip.viz.html",
        "anychip.backends.cpu.kernels.op_conv",
        "anychip.viz.terminal",
    ] or sorted(names) == sorted(
        ["anychip.viz.html", "anychip.backends.cpu.kernels.op_conv", "anychip.viz.terminal"]
    )


def test_every_import_goes_down_the_layers():
    bad = _violations()
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "name, rule, ok",
    [
        ("anychip.viz.terminal.use_rich", "core", False),
        ("anychip.core.plugin.backend.Backend", "backends/xpu_stub", True),
        ("anychip.core.plan.calibration.cache_root", "backends/opencl", False),
        ("anychip.backends.cpu.passes.fuse_attention_on", "backends/opencl", False),
        ("anychip.backends.arrayapi.tensor.Space", "backends/cuda", True),
        ("anychip.core.run.program.Program", "core/memory", False),
        ("anychip.core.memory.MemoryPool", "core/run", True),
        ("anychip.ir.window.window_geometry", "backends/opencl", True),
    ],
)
def test_the_rule_table_decides_as_written(name: str, rule: str, ok: bool):
    (r,) = [r for r in RULES if r[0] == rule]
    assert _allowed(name, r[1], r[2]) is ok
