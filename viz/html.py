"""The placement as one self-contained HTML page: inline SVG, CSS and script, no network.

``placement_html(view)`` lays the graph out in Python (``viz/layout.py``) and writes every
node as ``<g class="node" data-name=... data-device=...>`` filled with its device's colour,
each partition as a box (``<g class="partition">``, its cost decision on hover and in the side
table), each copy between devices as ``<g class="edge copy" data-bytes=N>`` labelled with its
size, and each fallback with its reason. Repeated blocks are folded into one box that opens on
click (``viz/layout.py``); the page searches node names, zooms (wheel) and pans (drag)
(``viz/assets/placement.js``). Graphviz is not needed.
"""

from __future__ import annotations

import html
from importlib import resources
from pathlib import Path

from anychip.core.memory.stats import _human
from anychip.viz.layout import NODE_H, NODE_W, Layout, Unit, layout
from anychip.viz.view import IO_COLOR, PlacementView, ViewNode, device_colors

__all__ = ["placement_html", "write_html", "graph_svg", "FOLD_ABOVE"]

#: Graphs with more nodes than this have their repeated blocks folded by default.
FOLD_ABOVE = 60

_CSS = """
body{margin:0;font:13px system-ui,sans-serif;display:flex;height:100vh;color:#222}
#side{width:360px;overflow-y:auto;overflow-x:hidden;padding:10px 12px;
 border-right:1px solid #ccc;background:#fafafa}
#canvas{flex:1;position:relative}
svg#graph{width:100%;height:100%;cursor:grab;background:#fff}
h1{font-size:15px;margin:4px 0 8px;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;margin:6px 0 12px}
td,th{border-bottom:1px solid #e3e3e3;padding:2px 4px;text-align:left;vertical-align:top}
tr.lit{background:#fff3c4}
.sw{display:inline-block;width:12px;height:12px;border:1px solid #555;margin-right:4px}
.node rect,.io rect{stroke:#333;stroke-width:1}
.node.fallback rect{stroke:#c00;stroke-width:2.5;stroke-dasharray:5 3}
.node.hit rect{stroke:#f0f;stroke-width:4}
.node text,.io text,.fold text{font-size:11px;pointer-events:none}
.node text.reason{fill:#a00;font-size:10px}
.fold rect{stroke:#333;stroke-width:1.5;cursor:pointer}
.members>rect{fill:#fff;stroke:#666;stroke-dasharray:3 3}
.partition rect{fill-opacity:.08;stroke-width:1.5;stroke-dasharray:6 3}
.partition.lit rect{fill-opacity:.25}
.partition text{font-size:12px;font-weight:600}
path.edge{fill:none;stroke:#888;stroke-width:1.2}
.copy path{stroke:#d62728;stroke-width:2.5;stroke-dasharray:7 4}
.copy text{fill:#d62728;font-size:11px;font-weight:600;paint-order:stroke;stroke:#fff;
 stroke-width:3}
#details{white-space:pre-wrap;font-family:monospace;font-size:12px;background:#fff;
 border:1px solid #ddd;padding:6px;min-height:60px}
button{font-size:12px;margin:2px}
#minimap{position:absolute;right:14px;bottom:14px;width:180px;height:240px;background:#fff;
 border:1px solid #999;box-shadow:0 1px 4px rgba(0,0,0,.25);cursor:crosshair}
#lens{fill:#1f77b4;fill-opacity:.12;stroke:#1f77b4;stroke-width:2;vector-effect:non-scaling-stroke}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _short(text: str, n: int = 30) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _node(n: ViewNode, x: float, y: float, color: str) -> str:
    """One node's element (graph nodes: ``class="node"``; inputs/outputs: ``class="io"``)."""
    cls = "node" + (" fallback" if n.fallback else "") if n.kind == "node" else "io"
    second = f"{n.op} \u00b7 {n.device}" if n.kind == "node" else f"{n.kind} {n.shape}"
    tip = f"{n.name}\n{n.op} on {n.device}\n{n.shape}\n{n.reason}"
    reason = ""
    if n.kind == "node" and not n.reason.startswith("chosen"):
        reason = f'<text class="reason" x="6" y="41">{_e(_short(n.reason, 32))}</text>'
    return (
        f'<g class="{cls}" id="n{n.id}" transform="translate({x:.1f},{y:.1f})" '
        f'data-name="{_e(n.name)}" data-op="{_e(n.op)}" data-device="{_e(n.device)}" '
        f'data-partition="{n.partition}" data-reason="{_e(n.reason)}" data-shape="{_e(n.shape)}">'
        f"<title>{_e(tip)}</title>"
        f'<rect width="{NODE_W}" height="{NODE_H}" rx="6" fill="{color}"/>'
        f'<text x="6" y="15">{_e(_short(n.name, 26))}</text>'
        f'<text x="6" y="29">{_e(_short(second, 28))}</text>{reason}</g>'
    )


def _fold(view: PlacementView, u: Unit, k: int, colors: dict[str, str]) -> str:
    """A folded run: its box, and its members (hidden until opened) as one column per repeat."""
    first = view.nodes[u.members[0]]
    pattern = "\u00b7".join(view.nodes[m].op for m in u.members[: u.period])
    color = colors.get(first.device, IO_COLOR)
    devices = list(dict.fromkeys(view.nodes[m].device for m in u.members))
    chips = "".join(  # a chip per device of the fold's nodes, at the right
        f'<rect x="{u.w - 14 * (i + 1) - 6}" y="8" width="12" height="12" '
        f'fill="{colors.get(d, IO_COLOR)}" stroke="#333"/>'
        for i, d in enumerate(reversed(devices))
    )
    tip = f"{len(u.members)} nodes: {u.reps} more repeat(s) of {pattern}; click to open"
    box = (
        f'<g class="fold" id="f{k}" data-fold="{k}" data-count="{len(u.members)}" '
        f'transform="translate({u.x:.1f},{u.y:.1f})">'
        f"<title>{_e(tip)}</title>"
        f'<rect width="{u.w}" height="{u.h}" rx="8" fill="{color}"/>'
        f'<rect x="4" y="4" width="{u.w - 8}" height="{u.h - 8}" rx="6" fill="none" '
        'stroke="#333" stroke-dasharray="2 2"/>'
        f'<text x="10" y="20">{_e(_short(f"{u.reps} more: {pattern}", 27))}</text>'
        f'<text x="10" y="36">{_e(_fold_where(view, u))} (click)</text>{chips}</g>'
    )
    gap = 10
    width = u.reps * (NODE_W + gap) + gap
    height = u.period * (NODE_H + gap) + gap
    parts = [
        f'<g class="members" id="m{k}" style="display:none" '
        f'transform="translate({u.x + u.w + 24:.1f},{u.y:.1f})">'
        f'<rect width="{width}" height="{height}" rx="8"/>'
    ]
    for j, m in enumerate(u.members):
        rep, row = divmod(j, u.period)
        n = view.nodes[m]
        x, y = gap + rep * (NODE_W + gap), gap + row * (NODE_H + gap)
        parts.append(_node(n, x, y, colors.get(n.device, IO_COLOR)))
    parts.append("</g>")
    return box + "".join(parts)


def _fold_where(view: PlacementView, u: Unit) -> str:
    parts = sorted({view.nodes[m].partition for m in u.members})
    devices = ",".join(dict.fromkeys(view.nodes[m].device for m in u.members))
    where = f"#{parts[0]}" if len(parts) == 1 else f"#{parts[0]}-#{parts[-1]}"
    return f"{len(u.members)} nodes, {devices}, {where}"


def _edges(lay: Layout) -> list[str]:
    out = []
    for ue in lay.edges:
        a, b = lay.units[ue.src], lay.units[ue.dst]
        x1, y1, x2, y2 = a.x + a.w / 2, a.y + a.h, b.x + b.w / 2, b.y
        dy = max(20.0, (y2 - y1) / 2)
        d = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + dy:.1f} {x2:.1f},{y2 - dy:.1f} {x2:.1f},{y2:.1f}"
        copies = ue.copies
        if not copies:
            out.append(f'<path class="edge" d="{d}" marker-end="url(#arrow)"/>')
            continue
        known = [c.copy_bytes for c in copies if c.copy_bytes is not None]
        nbytes = sum(known) if len(known) == len(copies) else None
        label = _human(nbytes) if nbytes is not None else "? B (dynamic)"
        tip = "\n".join(
            f"copy {c.tensor}: {c.src_device} -> {c.dst_device}, "
            f"{c.copy_bytes if c.copy_bytes is not None else '?'} bytes"
            for c in copies
        )
        out.append(
            f'<g class="edge copy" data-bytes="{nbytes if nbytes is not None else ""}" '
            f'data-tensor="{_e(",".join(c.tensor for c in copies))}"><title>{_e(tip)}</title>'
            f'<path d="{d}" fill="none" marker-end="url(#arrow)"/>'
            f'<text x="{(x1 + x2) / 2 + 6:.1f}" y="{(y1 + y2) / 2:.1f}">{_e(label)}</text></g>'
        )
    return out


def _svg(
    view: PlacementView, lay: Layout, colors: dict[str, str], attrs: str = 'id="graph"'
) -> str:
    parts = [
        f'<svg {attrs} role="img"><defs><marker id="arrow" viewBox="0 0 10 10" refX="9" '
        'refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#666"/></marker></defs>'
        '<g id="viewport"><g id="content">'
    ]
    by_index = {p.index: p for p in view.partitions}
    for index, (x, y, w, h) in sorted(lay.bands.items()):
        p = by_index[index]
        color = colors.get(p.device, IO_COLOR)
        parts.append(
            f'<g class="partition" id="p{index}" data-index="{index}" data-device="{_e(p.device)}">'
            f"<title>{_e(p.describe())}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="10" '
            f'fill="{color}" stroke="{color}"/>'
            f'<text x="{x + 8:.1f}" y="{y + 14:.1f}">#{index} {_e(p.device)} \u00b7 '
            f"{len(p.nodes)} nodes</text></g>"
        )
    parts.extend(_edges(lay))
    for k, u in enumerate(lay.units):
        if u.is_fold:
            parts.append(_fold(view, u, k, colors))
        else:
            n = view.nodes[u.members[0]]
            color = colors.get(n.device, IO_COLOR) if n.kind == "node" else IO_COLOR
            parts.append(_node(n, u.x, u.y, color))
    parts.append("</g></g></svg>")
    return "".join(parts)


def _side(view: PlacementView, colors: dict[str, str], folds: int) -> str:
    counts: dict[str, int] = {}
    for n in view.graph_nodes:
        counts[n.device] = counts.get(n.device, 0) + 1
    legend = "".join(
        f'<tr><td><span class="sw" style="background:{c}"></span>{_e(d)}</td>'
        f"<td>{counts.get(d, 0)} nodes</td></tr>"
        for d, c in colors.items()
    )
    parts_rows = "".join(
        f'<tr data-partition="{p.index}"><td>#{p.index}</td><td>{_e(p.device)}</td>'
        f"<td>{len(p.nodes)}</td><td>{_e(', '.join(f'{k}={v}' for k, v in p.info.items()))}"
        "</td></tr>"
        for p in view.partitions
    )
    copies = view.copies
    copy_rows = "".join(
        f"<tr><td>{_e(t)}</td><td>{_e(src)}\u2192{_e(dst)}</td>"
        f"<td>{nbytes if nbytes is not None else '?'}</td></tr>"
        for t, src, dst, nbytes in copies
    )
    fallbacks = [n for n in view.graph_nodes if n.fallback]
    fb_rows = "".join(
        f"<tr><td>{_e(n.name)}</td><td>{_e(n.op)}</td><td>{_e(n.reason)}</td></tr>"
        for n in fallbacks
    )
    summary = ", ".join(f"{k} {v}" for k, v in view.summary.items() if v)
    return (
        f"<h1>{_e(view.title)}</h1>"
        f'<input id="search" placeholder="search node names (Enter: next)" size="30">'
        f' <span id="count"></span><br><button id="fit">fit</button>'
        f'<button id="expand">open {folds} folds</button><button id="collapse">close folds</button>'
        f"<table>{legend}</table><div>nodes: {_e(summary)}</div>"
        f"<div>cost model: {_e(view.decision or 'not used')}</div>"
        f"<h2>partitions</h2><table><tr><th>#</th><th>device</th><th>nodes</th>"
        f"<th>cost decision</th></tr>{parts_rows}</table>"
        f"<h2>copies per run ({len(copies)})</h2><table><tr><th>tensor</th><th>edge</th>"
        f"<th>bytes</th></tr>{copy_rows}</table>"
        f"<h2>fallbacks ({len(fallbacks)})</h2><table>{fb_rows}</table>"
        f'<h2>selected</h2><div id="details">click a node</div>'
    )


def _minimap(lay: Layout) -> str:
    """The overview: the whole graph drawn again small (an SVG ``use`` of the graph's
    content, no second copy of the markup), with a lens showing what the main view shows;
    a click or drag on it moves the view there (``assets/placement.js``)."""
    w, h = max(lay.width, 1.0), max(lay.height, 1.0)
    return (
        f'<svg id="minimap" viewBox="-10 -10 {w + 20:.0f} {h + 20:.0f}" role="img" '
        'aria-label="overview of the whole graph"><use href="#content"/>'
        '<rect id="lens" x="0" y="0" width="0" height="0"/></svg>'
    )


def _script() -> str:
    return resources.files("anychip.viz").joinpath("assets/placement.js").read_text("utf-8")


def placement_html(view: PlacementView, fold: bool | None = None) -> str:
    """The page (a string). ``fold``: fold repeated blocks (default: above ``FOLD_ABOVE``
    nodes)."""
    if fold is None:
        fold = len(view.graph_nodes) > FOLD_ABOVE
    lay = layout(view, fold=fold)
    colors = device_colors(view.devices)
    folds = sum(1 for u in lay.units if u.is_fold)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(view.title)}</title><style>{_CSS}</style></head><body>"
        f'<div id="side">{_side(view, colors, folds)}</div>'
        f'<div id="canvas">{_svg(view, lay, colors)}{_minimap(lay)}</div>'
        f"<script>{_script()}</script></body></html>"
    )


#: The page's rules that draw the graph, for an SVG shown outside the page (a notebook):
#: scoped to ``.anychip-graph`` so they style nothing else there.
_GRAPH_RULES = [
    r
    for r in _CSS.replace("\n ", "").split("\n")
    if r.startswith((".node", ".io", ".fold", ".members", ".partition", "path.edge", ".copy"))
]


def graph_svg(view: PlacementView, fold: bool | None = None) -> str:
    """The placement graph as a static SVG at its natural size (11 px node text), with its
    own scoped styles and no script: what a notebook shows inline (``viz/notebook.py``).
    Hover shows each node's and copy's full text; folded blocks stay folded."""
    if fold is None:
        fold = len(view.graph_nodes) > FOLD_ABOVE
    lay = layout(view, fold=fold)
    colors = device_colors(view.devices)
    style = "".join(
        ",".join(f".anychip-graph {sel.strip()}" for sel in rule.split("{", 1)[0].split(","))
        + "{"
        + rule.split("{", 1)[1]
        for rule in _GRAPH_RULES
    )
    w, h = max(lay.width, 1.0), max(lay.height, 1.0)
    attrs = (
        f'class="anychip-graph" width="{w:.0f}" height="{h:.0f}" '
        f'viewBox="0 0 {w:.0f} {h:.0f}" style="font:13px system-ui,sans-serif"'
    )
    return f"<style>{style}</style>" + _svg(view, lay, colors, attrs)


def write_html(view: PlacementView, path: str | Path, fold: bool | None = None) -> Path:
    """Write ``placement_html(view)`` to ``path``; returns the path."""
    path = Path(path)
    path.write_text(placement_html(view, fold), encoding="utf-8")
    return path
