"""numpy kernels of the CPU backend: one op or op family per module, ``op_<name>.py``."""

from __future__ import annotations

import importlib
import pkgutil

__all__ = ["load_all"]


def load_all() -> None:
    """Import every ``op_*`` module of this package so their decorators register kernels."""
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("op_"):
            importlib.import_module(f"{__name__}.{info.name}")
