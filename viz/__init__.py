"""Pictures and readable output: the placement as SVG/DOT (``viz/dot.py``) or one
self-contained HTML page (``viz/html.py``), the model inspector (``viz/inspect.py``), the
profile's timeline (``viz/timeline.py``), and terminal rendering through ``rich``
(``viz/terminal.py``).

The reports (``core/report``) are data and text; their other views are here, registered with
``core/report/render.py`` as ``notebook``, ``terminal`` and ``timeline`` load, which importing
this package does. core never imports viz: the package root tells ``render`` to import it at
the first view asked for (``sess.placement()`` shown in Jupyter, say). None of this imports
rich, which loads only when a rich view is drawn.

Example::

    from anychip.viz import save_placement
    save_placement(sess, "placement.html")     # or .svg (Graphviz's dot) or .dot
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anychip.errors import AnychipError
from anychip.viz import notebook, terminal, timeline  # noqa: F401  (they register the views)
from anychip.viz.view import PlacementView, placement_view

__all__ = ["PlacementView", "placement_view", "save_placement"]

_FORMATS = (".html", ".htm", ".svg", ".dot", ".gv")


def save_placement(session: Any, path: str | Path, title: str = "") -> Path:
    """Write ``session``'s placement to ``path``; the suffix picks the format: ``.html``
    (self-contained, no Graphviz), ``.svg`` (Graphviz's ``dot``), ``.dot``/``.gv`` (source)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in _FORMATS:
        raise AnychipError(
            f"cannot write a placement picture to {str(path)!r}: the name must end in "
            f"{', '.join(_FORMATS)}"
        )
    view = placement_view(session, title)
    if suffix in (".html", ".htm"):
        from anychip.viz.html import write_html

        return write_html(view, path)
    from anychip.viz.dot import write_dot, write_svg

    return write_svg(view, path) if suffix == ".svg" else write_dot(view, path)
