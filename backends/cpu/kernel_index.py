"""Which ``kernels/op_*.py`` module registers which (domain, op type), so that the CPU's
kernel table imports a module the first time one of its ops is looked up, not all of them at
the first load (docs/decisions/052-cpu-kernels-imported-on-demand.md).

The index is what importing the modules registered: each kernel remembers the module whose
top-level code ran its decorator (``Kernel.module``), so the index is read off the table after
``load_all`` and is never kept by hand. It is stored in the cache folder
(``cpu-kernels/index-<key>.json``), the key built from anychip's version and the name, size
and modification time of every file of ``kernels/``: an edited, added or removed kernel file
is a new key, and the next process imports everything once and writes the new index. Without
an index (the first process, an unwritable cache, ``ANYCHIP_LAZY_KERNELS=0``) every module is
imported at once, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from anychip.core.plugin.kernels import KernelTable

__all__ = ["install", "index_of", "index_path"]

_PACKAGE = "anychip.backends.cpu.kernels"
_FORMAT = 1


def install(table: KernelTable) -> bool:
    """Defer the kernels of ``table`` (the CPU's) to their modules' first lookup, from the
    cached index; without one, import every module now and store the index. True when the
    kernels were deferred."""
    from anychip.backends.cpu.kernels import load_all

    path = index_path() if os.environ.get("ANYCHIP_LAZY_KERNELS", "1") != "0" else None
    index = _read(path) if path is not None else None
    if index is None:
        load_all()
        if path is not None:
            _write(path, index_of(table))
        return False
    for module, keys in index.items():
        table.defer_import(module, keys)
    return True


def index_of(table: KernelTable) -> dict[str, list[tuple[str, str]]]:
    """Every module of ``kernels/`` with the (domain, op type) of the kernels it registered
    into ``table`` (all of them imported): the index as stored."""
    index: dict[str, set[tuple[str, str]]] = {name: set() for name in _module_names()}
    for k in table:
        if k.module is not None and k.module.startswith(_PACKAGE + "."):
            index.setdefault(k.module, set()).add((k.domain, k.op_type))
    return {module: sorted(keys) for module, keys in sorted(index.items())}


def index_path() -> Path | None:
    """The index's file for the kernel files as they are now (None: not a folder of files)."""
    folder = _folder()
    if folder is None:
        return None
    digest = hashlib.sha256(f"{_FORMAT} {_version()}".encode())
    try:
        with os.scandir(folder) as it:
            entries = sorted(
                (e.name, e.stat()) for e in it if e.name.endswith(".py") and e.is_file()
            )
    except OSError:
        return None
    for name, st in entries:
        digest.update(f"\0{name} {st.st_size} {st.st_mtime_ns}".encode())
    from anychip.paths import cache_root

    return cache_root() / "cpu-kernels" / f"index-{digest.hexdigest()[:20]}.json"


def _read(path: Path) -> dict[str, list[tuple[str, str]]] | None:
    try:
        data = json.loads(path.read_bytes())
        modules = data["modules"]
        index = {
            str(module): [(str(d), str(op)) for d, op in keys] for module, keys in modules.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent or not ours: imported whole, written again
    if not set(_module_names()) <= set(index):
        return None  # a module the index does not know: imported whole, written again
    from anychip.paths import used

    used(path)
    return index


def _write(path: Path, index: dict[str, Any]) -> None:
    from anychip.paths import write_atomic

    body = {"format": _FORMAT, "version": _version(), "modules": index}
    try:
        write_atomic(path, json.dumps(body, indent=0, sort_keys=True).encode())
    except OSError:
        pass  # a read-only cache: every process imports the modules, as without an index


def _module_names() -> list[str]:
    """The ``op_*`` modules of ``kernels/``, full names."""
    folder = _folder()
    if folder is None:
        return []
    return sorted(
        f"{_PACKAGE}.{name[:-3]}"
        for name in os.listdir(folder)
        if name.startswith("op_") and name.endswith(".py")
    )


def _folder() -> Path | None:
    pkg = sys.modules.get(_PACKAGE)
    if pkg is None:
        import importlib

        pkg = importlib.import_module(_PACKAGE)
    paths = list(getattr(pkg, "__path__", ()))
    return Path(paths[0]) if len(paths) == 1 and os.path.isdir(paths[0]) else None


def _version() -> str:
    from anychip.version import __version__

    return f"{__version__} py{sys.version_info[0]}.{sys.version_info[1]}"
