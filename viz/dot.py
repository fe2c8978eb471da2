"""The placement as Graphviz DOT, and as SVG through the system's ``dot``.

Built with the ``graphviz`` package (the ``viz`` extra: it quotes names and runs ``dot``
for us); SVG needs Graphviz's ``dot`` program on the PATH. Each node is ``id="node_<i>"``
(``<i>`` the view's node id), filled with its device's colour; each partition a cluster
labelled with its device and cost notes; each copy between devices a red edge
``id="copy_<k>"`` labelled with its bytes; each fallback red-bordered with its reason; and a
side table (``id="legend"``) lists the devices' colours and every partition's cost decision.
"""

from __future__ import annotations

import html
import shutil
from pathlib import Path
from typing import Any

from anychip.errors import AnychipError
from anychip.viz.view import IO_COLOR, PlacementView, ViewNode, device_colors

__all__ = ["placement_dot", "write_dot", "write_svg", "svg_bytes"]


def _graphviz() -> Any:
    try:
        import graphviz
    except ImportError:
        raise AnychipError(
            "the placement as .dot or .svg needs the graphviz package: pip install "
            "'anychip[viz]' (or write .html, which needs nothing)"
        ) from None
    return graphviz


def _label(n: ViewNode) -> str:
    if n.kind != "node":
        return f"{n.name}\n{n.kind} {n.shape}"
    text = f"{n.name}\n{n.op} · {n.device}"
    if n.fallback:
        reason = n.reason if len(n.reason) <= 48 else n.reason[:47] + "…"
        text += f"\n{reason}"
    return text.replace("\\", "\\\\")


def _legend(view: PlacementView, colors: dict[str, str]) -> str:
    """The side table: devices' colours, then each partition and its cost decision."""
    e = html.escape
    rows = [
        f'<TR><TD BGCOLOR="{c}"> </TD><TD ALIGN="LEFT" COLSPAN="2">{e(d)}</TD></TR>'
        for d, c in colors.items()
    ]
    rows.append("<TR><TD><B>#</B></TD><TD><B>device</B></TD><TD><B>cost decision</B></TD></TR>")
    for p in view.partitions:
        notes = ", ".join(f"{k}={v}" for k, v in p.info.items()) or "-"
        rows.append(
            f"<TR><TD>{p.index}</TD><TD>{e(p.device)} ({len(p.nodes)})</TD>"
            f'<TD ALIGN="LEFT">{e(notes)}</TD></TR>'
        )
    if view.decision:
        rows.append(f'<TR><TD COLSPAN="3" ALIGN="LEFT">{e(view.decision)}</TD></TR>')
    return f'<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0">{"".join(rows)}</TABLE>>'


def placement_dot(view: PlacementView) -> Any:
    """A ``graphviz.Digraph`` of the placement (``.source`` is the DOT text)."""
    graphviz = _graphviz()
    colors = device_colors(view.devices)
    g = graphviz.Digraph(
        "placement",
        graph_attr={"rankdir": "TB", "label": view.title, "labelloc": "t", "fontname": "Helvetica"},
    )
    g.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="10")
    g.attr("edge", color="#888888", arrowsize="0.6")
    members: dict[int, list[ViewNode]] = {}
    for n in view.nodes:
        if n.kind == "node":
            members.setdefault(n.partition, []).append(n)
        else:
            g.node(f"n{n.id}", _label(n), id=f"io_{n.id}", fillcolor=IO_COLOR, shape="note")
    by_index = {p.index: p for p in view.partitions}
    for index, nodes in members.items():
        p = by_index[index]
        color = colors.get(p.device, IO_COLOR)
        with g.subgraph(name=f"cluster_{index}") as c:
            c.attr(
                label=f"#{index} {p.device}: {len(nodes)} nodes",
                color=color,
                penwidth="2",
                style="rounded,dashed",
                id=f"partition_{index}",
                tooltip=p.describe(),
            )
            for n in nodes:
                extra = {"color": "#cc0000", "penwidth": "2.5"} if n.fallback else {}
                c.node(
                    f"n{n.id}",
                    _label(n),
                    id=f"node_{n.id}",
                    fillcolor=color,
                    tooltip=f"{n.name}: {n.reason}",
                    **extra,
                )
    for k, edge in enumerate(view.edges):
        if edge.is_copy:
            size = f"{edge.copy_bytes} B" if edge.copy_bytes is not None else "? B (dynamic)"
            g.edge(
                f"n{edge.src}",
                f"n{edge.dst}",
                label=size,
                id=f"copy_{k}",
                color="#d62728",
                fontcolor="#d62728",
                penwidth="2",
                style="dashed",
                tooltip=f"copy {edge.tensor} {edge.src_device}->{edge.dst_device}",
            )
        else:
            g.edge(f"n{edge.src}", f"n{edge.dst}")
    g.node("legend", _legend(view, colors), shape="plaintext", style="", id="legend")
    return g


def write_dot(view: PlacementView, path: str | Path) -> Path:
    """Write the DOT source (no ``dot`` program needed)."""
    path = Path(path)
    path.write_text(placement_dot(view).source, encoding="utf-8")
    return path


def svg_bytes(view: PlacementView) -> bytes:
    """The SVG rendered by Graphviz's ``dot``."""
    graphviz = _graphviz()
    if shutil.which("dot") is None:
        raise AnychipError(
            "the placement as .svg needs Graphviz's dot program, which is not on the PATH: "
            "install Graphviz (apt-get install graphviz, brew install graphviz, ...) or write "
            ".html, which needs nothing"
        )
    try:
        return placement_dot(view).pipe(format="svg")
    except graphviz.ExecutableNotFound as e:
        raise AnychipError(f"Graphviz's dot could not be run ({e}); install Graphviz") from e
    except graphviz.CalledProcessError as e:
        raise AnychipError(f"Graphviz's dot failed on the placement graph: {e}") from e


def write_svg(view: PlacementView, path: str | Path) -> Path:
    """Write the SVG Graphviz's ``dot`` draws (see ``svg_bytes``)."""
    path = Path(path)
    path.write_bytes(svg_bytes(view))
    return path
