"""Kernels a table imports at their first lookup (``KernelTable.defer_import``), and the module
each kernel names as its registrar (``Kernel.module``), on a package written by the test."""

from __future__ import annotations

import importlib
import sys
import uuid
from pathlib import Path

import pytest

from anychip.core.plugin.kernels import KernelTable
from anychip.ir.dtypes import DType

_TABLE = """
from anychip.core.plugin.kernels import KernelTable
TABLE = KernelTable("cpu")
kernel = TABLE.register
"""
_HELPERS = """
from {pkg}.table import kernel

def register_both(fn):
    kernel(("A", "B"), since=1)(fn)
"""
_OP_A = """
from {pkg}._helpers import register_both

def a(x):
    return ("a", x)

register_both(a)
"""
_OP_B = """
from {pkg}.table import kernel
from {pkg} import op_c

@kernel("B", since=7)
def b(x):
    return ("b", x)
"""
_OP_C = """
from {pkg}.table import kernel

@kernel("C", domain="my.domain", since=1)
def c(x):
    return ("c", x)
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh package of kernel modules; returns a function importing one of its modules."""
    pkg = f"lazyk_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / pkg
    folder.mkdir()
    files = {"__init__": "", "table": _TABLE, "_helpers": _HELPERS, "op_a": _OP_A}
    files.update({"op_b": _OP_B, "op_c": _OP_C})
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text.format(pkg=pkg))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    for name in [n for n in sys.modules if n == pkg or n.startswith(pkg + ".")]:
        del sys.modules[name]


def _index(pkg: str) -> dict[str, list[tuple[str, str]]]:
    return {
        f"{pkg}.op_a": [("", "A"), ("", "B")],
        f"{pkg}.op_b": [("", "B")],
        f"{pkg}.op_c": [("my.domain", "C")],
    }


def test_each_kernel_names_the_module_whose_top_level_code_registered_it(package) -> None:
    table = importlib.import_module(f"{package}.table").TABLE
    importlib.import_module(f"{package}.op_a")  # through a helper module's function
    importlib.import_module(f"{package}.op_b")  # imports op_c on its way
    got = {(k.op_type, k.since): k.module for k in table}
    assert got == {
        ("A", 1): f"{package}.op_a",
        ("B", 1): f"{package}.op_a",
        ("B", 7): f"{package}.op_b",
        ("C", 1): f"{package}.op_c",
    }
    direct = KernelTable("x")
    direct.register("Relu")(lambda x: x)  # at run time: the script's module, not a kernel's
    assert not str(next(iter(direct)).module).startswith(package)


def test_a_deferred_module_is_imported_at_the_first_lookup_of_one_of_its_ops(package) -> None:
    table = importlib.import_module(f"{package}.table").TABLE
    for module, keys in _index(package).items():
        table.defer_import(module, keys)
    merged = KernelTable("cpu")  # what the registry does: a table of its own, merged
    merged.merge(table)
    assert not [n for n in sys.modules if n.startswith(f"{package}.op_")]
    match = merged.lookup("my.domain", "C", 1)
    assert match and match.kernel is not None and match.kernel.fn("x") == ("c", "x")
    assert sorted(n for n in sys.modules if n.startswith(f"{package}.op_")) == [f"{package}.op_c"]
    assert merged.lookup("", "A", 1).kernel.fn(1) == ("a", 1)  # type: ignore[union-attr]
    assert f"{package}.op_b" not in sys.modules
    # B since 7 lives in op_b: the lookup at version 9 imports it, not only op_a's B since 1
    assert merged.lookup("", "B", 9).kernel.fn(2) == ("b", 2)  # type: ignore[union-attr]
    assert len(merged) == 4 and merged.ops() == {("", "A"), ("", "B"), ("my.domain", "C")}


def test_a_later_plugin_still_wins_over_a_kernel_imported_after_it(package) -> None:
    table = importlib.import_module(f"{package}.table").TABLE
    for module, keys in _index(package).items():
        table.defer_import(module, keys)
    merged = KernelTable("cpu")
    merged.merge(table)
    plugin = KernelTable("cpu")
    plugin.register("B", since=7)(lambda x: ("plugin", x))
    merged.merge(plugin)  # registered after the CPU's own, which arrives later by import
    assert merged.lookup("", "B", 7).kernel.fn(0) == ("plugin", 0)  # type: ignore[union-attr]
    assert [k.since for k in merged._by_op[("", "B")]] == [1, 7, 7]


def test_a_snapshot_keeps_what_is_deferred_and_iteration_imports_everything(package) -> None:
    table = importlib.import_module(f"{package}.table").TABLE
    for module, keys in _index(package).items():
        table.defer_import(module, keys)
    merged = KernelTable("cpu")
    merged.merge(table)
    before = merged.snapshot()
    merged.register("D")(lambda x: x)
    assert merged.lookup("", "A", 1)
    merged.restore(before)
    assert not merged.lookup("", "D", 1)
    assert merged.lookup("", "A", 1)  # deferred again after the restore, found again
    assert {(k.op_type, k.since) for k in merged} == {("A", 1), ("B", 1), ("B", 7), ("C", 1)}
    assert not merged._deferred and all(f"{package}.op_{m}" in sys.modules for m in ("a", "b", "c"))


def test_an_imported_or_already_deferred_module_is_not_deferred_again(package) -> None:
    table = importlib.import_module(f"{package}.table").TABLE
    importlib.import_module(f"{package}.op_c")
    for _ in range(2):
        for module, keys in _index(package).items():
            table.defer_import(module, keys)
    assert set(table._deferred) == {("", "A"), ("", "B")}
    assert len(table._deferred[("", "B")]) == 2  # op_a and op_b, once each
    assert table.lookup("", "B", 1, DType.FLOAT)


def test_threads_looking_up_one_deferred_op_together_find_it_once(package) -> None:
    import threading

    table = importlib.import_module(f"{package}.table").TABLE
    for module, keys in _index(package).items():
        table.defer_import(module, keys)
    merged = KernelTable("cpu")
    merged.merge(table)
    start, found = threading.Barrier(8), []

    def look() -> None:
        start.wait()
        found.append(merged.lookup("", "B", 9).kernel)

    threads = [threading.Thread(target=look) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(found) == 8 and all(k is not None and k.since == 7 for k in found)
    assert [k.since for k in merged._by_op[("", "B")]] == [1, 7]
