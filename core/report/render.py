"""The reports' views other than their text, looked up by (report kind, format).

``core/report`` holds the reports as data with their plain text (``__str__``). Their other
views are drawn in ``viz/``, which registers one function per (kind, format) here with
``@renders(kind, fmt)``: core never imports viz. A lookup that finds nothing calls, once, the
provider the package root installs (``anychip/__init__.py``: it imports ``anychip.viz``, whose
modules register as they load), so ``import anychip`` loads neither viz nor rich, and the
first ``_repr_html_`` or ``__rich__`` does.

Kinds: ``"placement"``, ``"memory"``, ``"profile"``. Formats: ``"html"`` (a fragment for
Jupyter's ``_repr_html_``), ``"rich"`` (a rich renderable for ``__rich__``), ``"timeline"``
(the profile's self-contained HTML page, ``Profile.save_html``).

Example (a plugin's own view)::

    from anychip.core.report.render import render, renders

    @renders("memory", "markdown")
    def memory_markdown(report):
        return "\\n".join("| " + " | ".join(row) + " |" for row in report.rows())

    render("memory", "markdown", sess.memory())
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from anychip.errors import AnychipError

__all__ = ["renders", "find", "render", "set_provider", "Rendered"]

_F = TypeVar("_F", bound=Callable[..., Any])
_renderers: dict[tuple[str, str], Callable[[Any], Any]] = {}
_provider: Callable[[], None] | None = None
_provided = False


def renders(kind: str, fmt: str) -> Callable[[_F], _F]:
    """Decorator: the function draws reports of ``kind`` in format ``fmt`` (the last one
    registered for a pair wins)."""

    def register(fn: _F) -> _F:
        _renderers[(kind, fmt)] = fn
        return fn

    return register


def set_provider(provider: Callable[[], None] | None) -> None:
    """``provider()`` registers the renderers (the package root installs one that imports
    ``anychip.viz``); it is called at the first lookup that finds nothing."""
    global _provider, _provided
    _provider, _provided = provider, False


def find(kind: str, fmt: str) -> Callable[[Any], Any] | None:
    """The function drawing ``kind`` reports as ``fmt``, or None."""
    global _provided
    fn = _renderers.get((kind, fmt))
    if fn is None and not _provided and _provider is not None:
        _provider()  # an error here (a broken viz) propagates: nothing is swallowed
        _provided = True
        fn = _renderers.get((kind, fmt))
    return fn


def render(kind: str, fmt: str, report: Any) -> Any:
    """``report`` drawn as ``fmt``; ``AnychipError`` when nothing draws that pair."""
    fn = find(kind, fmt)
    if fn is None:
        known = sorted(f for k, f in _renderers if k == kind)
        raise AnychipError(
            f"nothing draws the {kind} report as {fmt!r} (known: {', '.join(known) or 'none'}); "
            "the views are in anychip.viz: check that it imports"
        )
    return fn(report)


class Rendered:
    """Mixin of the reports: Jupyter's ``_repr_html_`` and rich's ``__rich__`` through the
    renderers registered for ``report_kind``; where none is, Jupyter shows the text (None from
    ``_repr_html_``) and rich prints ``str(report)``."""

    __slots__ = ()
    #: The kind the renderers are registered under.
    report_kind = ""

    def _repr_html_(self) -> str | None:
        fn = find(self.report_kind, "html")
        return None if fn is None else fn(self)

    def __rich__(self) -> Any:
        fn = find(self.report_kind, "rich")
        return str(self) if fn is None else fn(self)
