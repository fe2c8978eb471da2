"""HTML for Jupyter: what ``PlacementReport``, ``MemoryReport``, ``Profile`` and ``Session``
show through ``_repr_html_`` (found through ``core/report/render.py``: ``@renders(kind,
"html")``). Plain tables with the device colours of the placement pictures; a session shows
its placement graph inline and a profile its timeline (static SVG at natural size in a
scrolled box: node text at 11 px, full texts on hover); no script, no external reference
(notebooks are shared as files), styles scoped to anychip's own classes."""

from __future__ import annotations

import html
from typing import Any

from anychip.core.memory.stats import _human
from anychip.core.report.render import renders
from anychip.viz.view import device_colors

__all__ = ["placement_report_html", "memory_html", "profile_html", "session_html"]

#: The box an inline picture scrolls in (its own size kept: readable text, not shrunk).
_BOX = 'style="max-height:640px;max-width:100%;overflow:auto;border:1px solid #ddd"'

_STYLE = (
    "<style>.anychip td,.anychip th{padding:1px 8px;text-align:left}"
    ".anychip .sw{display:inline-block;width:10px;height:10px;margin-right:4px;"
    "border:1px solid #555}</style>"
)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="anychip"><tr>{head}</tr>{body}</table>'


def _dev(device: str, colors: dict[str, str]) -> str:
    color = colors.get(device, "#ccc")
    return f'<span class="sw" style="background:{color}"></span>{_e(device)}'


@renders("placement", "html")
def placement_report_html(report: Any, max_nodes: int = 500) -> str:
    """A ``PlacementReport``: summary, partitions, copies, then the nodes (the first
    ``max_nodes``)."""
    colors = device_colors(list(report.devices))
    counts = ", ".join(f"{_dev(d, colors)} {c}" for d, c in report.by_device().items())
    parts = _table(
        ["#", "device", "nodes", "cost model"],
        [
            [
                str(p.index),
                _dev(p.device, colors),
                str(len(p.nodes)),
                _e(", ".join(f"{k}={v}" for k, v in p.info.items())),
            ]
            for p in report.partitions
        ],
    )
    copies = _table(
        ["tensor", "from", "to", "bytes"],
        [
            [_e(c.tensor), _e(c.src), _e(c.dst), "?" if c.size is None else str(c.size)]
            for c in report.copies
        ],
    )
    nodes = _table(
        ["node", "op", "device", "part", "reason"],
        [
            [_e(n.name), _e(n.op_type), _dev(n.device, colors), str(n.partition), _e(n.reason)]
            for n in report.nodes[:max_nodes]
        ],
    )
    more = (
        f"<p>... and {len(report.nodes) - max_nodes} more nodes</p>"
        if len(report.nodes) > max_nodes
        else ""
    )
    decision = f"<p>cost model: {_e(report.decision)}</p>" if report.decision else ""
    return (
        f"{_STYLE}<div><b>placement over {_e(', '.join(report.devices))}</b>: {counts}; "
        f"{len(report.partitions)} partitions; {report.copy_count} copies/run "
        f"({_human(report.copy_bytes)})</div>{decision}<h4>partitions</h4>{parts}"
        f"<h4>copies per run</h4>{copies}<details><summary>nodes ({len(report.nodes)})"
        f"</summary>{nodes}{more}</details>"
    )


@renders("memory", "html")
def memory_html(report: Any) -> str:
    """A ``MemoryReport`` as one table (its ``rows()``), then its notes."""
    rows = [[_e(c) for c in row] for row in report.rows()]
    notes = "".join(f"<p>note: {_e(n)}</p>" for n in report.all_notes())
    return _STYLE + _table(list(report.HEAD), rows) + notes


@renders("profile", "html")
def profile_html(profile: Any, top: int = 20) -> str:
    """A ``Profile``: runs, time per device, the slowest nodes (``save_html`` has the
    timeline)."""
    colors = device_colors(list(profile.devices))
    per = ", ".join(f"{_e(d)} {t * 1e3:.3f} ms" for d, t in profile.device_times().items())
    runs = ", ".join(f"{t * 1e3:.3f}" for t in profile.run_seconds)
    rows = [
        [_e(n), _e(op), _dev(d, colors), f"{t * 1e3:.3f}"]
        for n, op, d, t in profile.node_times()[:top]
    ]
    from anychip.viz.timeline import timeline_svg

    return (
        f"{_STYLE}<div><b>profile</b>: {profile.runs} run(s), {runs} ms; per run: {per}</div>"
        f"<div {_BOX}>{timeline_svg(profile, svg_id='')}</div>"
        + _table(["node", "op", "device", "ms/run"], rows)
    )


@renders("session", "html")
def session_html(session: Any) -> str:
    """A ``Session``: its devices, inputs and outputs, the placement graph, then the
    placement report's tables (a closed session says so)."""
    from anychip.viz.html import graph_svg
    from anychip.viz.view import placement_view

    if getattr(session, "_closed", False):
        return f"<div><b>anychip session</b> (closed) on {_e(', '.join(session.devices))}</div>"
    ios = ", ".join(f"{_e(i.name)} {_e(i.type)}" for i in session.inputs)
    outs = ", ".join(f"{_e(o.name)} {_e(o.type)}" for o in session.outputs)
    view = placement_view(session)
    return (
        f"<div><b>anychip session</b> {_e(view.title)}: inputs {ios}; outputs {outs}</div>"
        f"<div {_BOX}>{graph_svg(view)}</div>" + placement_report_html(session.placement())
    )
