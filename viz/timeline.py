"""The profile as one self-contained HTML timeline (no network): a lane per device and one for
the copies, partitions as light bars with their nodes inside, copies with their bytes; hover
shows each span, the wheel zooms the time axis. The same events as ``Profile.to_trace()``
(the Perfetto trace) and a table of the slowest nodes. ``Profile.save_html`` finds it through
``core/report/render.py`` (``@renders("profile", "timeline")``).
"""

from __future__ import annotations

import html
from typing import Any

from anychip.core.memory.stats import _human
from anychip.core.report.render import renders
from anychip.viz.view import device_colors

__all__ = ["timeline_html", "timeline_svg"]

_LANE, _LEFT, _WIDTH = 46, 90, 1200

_JS = """
(function(){const svg=document.getElementById('tl'),g=document.getElementById('spans');
let s=1,tx=0;function apply(){g.setAttribute('transform',`translate(${tx},0) scale(${s},1)`);}
svg.addEventListener('wheel',e=>{e.preventDefault();const r=svg.getBoundingClientRect();
const mx=e.clientX-r.left-LEFT;const f=Math.exp(-e.deltaY*0.002);tx=mx-(mx-tx)*f;s=Math.max(1,s*f);
if(s===1)tx=0;apply();},{passive:false});})();
""".replace("LEFT", str(_LEFT))


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _lanes(profile: Any) -> list[str]:
    return list(profile.devices) + ["copies"]


def _span(e: Any, y: float, scale: float, color: str) -> str:
    x, w = e.start * scale, max(e.seconds * scale, 0.6)
    tip = (
        f"{e.name} ({e.op + ', ' if e.op else ''}{e.device}, run {e.run}): {e.seconds * 1e3:.3f} ms"
    )
    if e.kind == "copy":
        tip += f", {e.bytes} bytes ({_human(e.bytes)})"
    h = _LANE - 14 if e.kind == "partition" else _LANE - 24
    dy = 4 if e.kind == "partition" else 10
    opacity = "0.3" if e.kind == "partition" else "0.95"
    return (
        f'<rect class="span {e.kind}" data-name="{_e(e.name)}" data-device="{_e(e.device)}" '
        f'x="{x:.2f}" y="{y + dy:.1f}" width="{w:.2f}" height="{h}" fill="{color}" '
        f'fill-opacity="{opacity}" stroke="#333" stroke-width="0.3" '
        f'vector-effect="non-scaling-stroke"><title>{_e(tip)}</title></rect>'
    )


def timeline_svg(profile: Any, svg_id: str = "tl") -> str:
    """The timeline alone: one lane per device and one for copies, a span per node,
    partition and copy with its time on hover (no script: the page adds its zoom)."""
    lanes = _lanes(profile)
    colors = device_colors(list(profile.devices))
    colors["copies"] = "#d62728"
    end = max([e.start + e.seconds for e in profile.events] + [1e-9])
    scale = _WIDTH / end
    rows = []
    for i, lane in enumerate(lanes):
        y = 24 + i * _LANE
        rows.append(
            f'<text x="6" y="{y + _LANE / 2 + 4:.0f}" class="lane">{_e(lane)}</text>'
            f'<line x1="{_LEFT}" x2="{_LEFT + _WIDTH}" y1="{y + _LANE}" y2="{y + _LANE}" '
            'stroke="#ddd"/>'
        )
    spans = []
    for e in sorted(profile.events, key=lambda e: e.kind != "partition"):
        lane = "copies" if e.kind == "copy" else e.device
        y = 24 + (lanes.index(lane) if lane in lanes else 0) * _LANE
        spans.append(_span(e, y, scale, colors.get(lane, "#999")))
    ticks = []
    for k in range(11):
        t = end * k / 10
        ticks.append(
            f'<text x="{_LEFT + t * scale:.0f}" y="14" class="tick">{t * 1e3:.2f} ms</text>'
        )
    height = 24 + len(lanes) * _LANE + 10
    ident = f' id="{svg_id}"' if svg_id else ""
    return (
        f'<svg{ident} class="anychip-tl" '
        f'width="{_LEFT + _WIDTH + 20}" height="{height}" '
        'style="font:13px system-ui,sans-serif">'
        "<style>.anychip-tl .lane{font-weight:600}.anychip-tl .tick{font-size:10px;fill:#555}"
        "</style>"
        f"{''.join(rows)}"
        f'<g transform="translate({0},0)">{"".join(ticks)}</g>'
        f'<svg x="{_LEFT}" y="0" width="{_WIDTH + 10}" height="{height}">'
        f'<g class="spans">{"".join(spans)}</g></svg></svg>'
    )


@renders("profile", "timeline")
def timeline_html(profile: Any) -> str:
    """The page (a string) for a ``core.report.profile.Profile``."""
    svg = timeline_svg(profile).replace('<g class="spans">', '<g id="spans">', 1)  # its zoom
    top = "".join(
        f"<tr><td>{_e(n)}</td><td>{_e(op)}</td><td>{_e(d)}</td><td>{t * 1e3:.3f}</td></tr>"
        for n, op, d, t in profile.node_times()[:25]
    )
    per_device = ", ".join(f"{d} {t * 1e3:.3f} ms" for d, t in profile.device_times().items())
    runs = ", ".join(f"{t * 1e3:.2f}" for t in profile.run_seconds)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>profile: {_e(profile.title)}</title><style>"
        "body{font:13px system-ui,sans-serif;margin:12px}svg{border:1px solid #ccc}"
        ".lane{font-weight:600}.tick{font-size:10px;fill:#555}"
        "table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #eee}"
        "</style></head><body>"
        f"<h1>profile: {_e(profile.title)}</h1>"
        f"<p>{profile.runs} run(s) of {', '.join(map(_e, profile.devices))}: {runs} ms each; "
        f"per run: {_e(per_device)}. The same events as the Perfetto trace "
        "(<code>Profile.save_trace</code>). Wheel: zoom time.</p>"
        f"{svg}"
        "<h2>slowest nodes (mean per run)</h2><table><tr><th>node</th><th>op</th>"
        f"<th>device</th><th>ms</th></tr>{top}</table>"
        f"<script>{_JS}</script></body></html>"
    )
