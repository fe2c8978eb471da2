"""Fusion patterns any backend enables by name.

A pattern is a fusion pass written once, here, for every backend: it rewrites a chain of
standard ops into one ``anychip``-domain op, so a backend enables it when its kernel table runs
that op. Nothing here knows which backends do; each backend says so in its own
``anychip_register_passes`` hook.

* ``"attention"``: ``FuseAttentionPass`` (``fuse_attention.py``, pass name
  ``fuse_attention``) makes ``anychip::FusedAttention`` of scaled dot-product attention;
* ``"elementwise"``: ``FuseElementwisePass`` (``fuse_elementwise.py``, pass name
  ``fuse_elementwise``) makes ``anychip::FusedElementwise`` of element-wise chains.

A backend enables patterns on its partitions in one line::

    from anychip.ir.passes import patterns

    @hookimpl
    def anychip_register_passes(registry):
        patterns.enable(registry, "attention", "elementwise", backends=["mychip"])

which registers a new pass of each pattern per backend name, in the order named (attention
before the element-wise fusion, which would otherwise take the attention's scale into a chain
of its own). A backend that puts a pattern among passes of its own takes the pass with
``patterns.get(name)`` and registers it itself (the CPU, ``backends/cpu/passes``). Every
pattern is an optimization (``anychip.load(..., optimize=False)`` leaves it out) and counts its
firings in ``graph.meta["fusions"]`` under its pass name, which the placement report shows.

A new pattern is one module here (``fuse_<what>.py``) whose pass class is decorated with
``@pattern("<what>")``; the modules are imported on the first lookup.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from anychip.errors import PluginError
from anychip.ir.passes.base import Pass

__all__ = ["pattern", "names", "get", "enable"]

_PATTERNS: dict[str, type[Pass]] = {}
_loaded = False
_P = TypeVar("_P", bound=type[Pass])


def pattern(name: str) -> Callable[[_P], _P]:
    """Class decorator: the ``Pass`` subclass is the pattern ``name``."""

    def register(cls: _P) -> _P:
        if _PATTERNS.get(name, cls) is not cls:
            raise PluginError(
                f"pattern {name!r} is {_PATTERNS[name].__name__} already; {cls.__name__} needs "
                "another name"
            )
        _PATTERNS[name] = cls
        return cls

    return register


def _load() -> None:
    """Import every public module of this package, so their decorators register patterns."""
    global _loaded
    if not _loaded:
        for info in pkgutil.iter_modules(__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{__name__}.{info.name}")
        _loaded = True


def names() -> tuple[str, ...]:
    """The names of the patterns, sorted."""
    _load()
    return tuple(sorted(_PATTERNS))


def get(name: str) -> Pass:
    """A new pass of the pattern ``name`` (each backend gets its own instance)."""
    _load()
    cls = _PATTERNS.get(name)
    if cls is None:
        raise PluginError(f"no fusion pattern named {name!r}; the patterns are {_listed()}")
    return cls()


def enable(registry: Any, *pattern_names: str, backends: str | Iterable[str]) -> None:
    """Register the patterns ``pattern_names``, in that order, on the partitions of each backend
    of ``backends`` (a name or several): ``registry.add_pass(get(name), backend=b)``.

    ``registry`` is the one an ``anychip_register_passes`` hook receives.
    """
    targets = [backends] if isinstance(backends, str) else list(backends)
    for name in pattern_names:
        get(name)  # every name checked before anything is added
    for b in targets:
        for name in pattern_names:
            registry.add_pass(get(name), backend=b)


def _listed() -> str:
    return ", ".join(repr(n) for n in names()) or "none"
