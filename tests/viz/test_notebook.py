"""Notebook views inline (issue 44): a ``Session`` shows its placement graph (a static SVG at
its natural size, node text 11 px, in a scrolled box) and its report; a ``Profile`` its
timeline. No script, no external reference, and styles scoped to anychip's classes so a
notebook's other cells are not restyled (viz/notebook.py)."""

from __future__ import annotations

import re

from tests.viz.parse import Page, external_references


def _scoped(html: str) -> list[str]:
    """The selectors of every inline stylesheet that are not under an anychip class."""
    loose = []
    for sheet in re.findall(r"<style>(.*?)</style>", html, re.S):
        for rule in re.findall(r"([^{}]+)\{[^{}]*\}", sheet):
            for sel in rule.split(","):
                sel = sel.strip()
                if not sel.startswith((".anychip", ".sw")):
                    loose.append(sel)
    return loose


def test_a_session_shows_its_placement_graph_inline(mixed) -> None:
    html = mixed._repr_html_()
    page = Page(html)
    svgs = [a for tag, a, _ in page.elements if tag == "svg" and a.get("class") == "anychip-graph"]
    assert len(svgs) == 1, [a for tag, a, _ in page.elements if tag == "svg"]
    svg = svgs[0]
    w, h = float(svg["width"]), float(svg["height"])
    assert svg["viewbox"] == f"0 0 {w:.0f} {h:.0f}"  # html.parser lowers attribute names
    # every node of the report drawn once, with its device as data and its full reason on hover
    report = mixed.placement()
    drawn = {a["data-name"]: a for a in page.with_class("node")}
    assert set(drawn) == {n.name for n in report.nodes}
    assert {drawn[n.name]["data-device"] for n in report.nodes} == set(report.by_device())
    assert len(page.with_class("copy")) >= 1  # the mixed placement copies between devices
    assert "font-size:11px" in html  # node text at its natural size (the box scrolls)
    assert "overflow:auto" in html
    # then the report's tables
    assert "copies per run" in html and "partitions" in html
    assert external_references(html) == [] and "<script" not in html
    assert _scoped(html) == [], _scoped(html)


def test_a_profile_shows_its_timeline_inline(mixed) -> None:
    prof = mixed.profile(runs=1)
    html = prof._repr_html_()
    page = Page(html)
    assert len(page.with_class("span")) == len(prof.events)
    assert "<script" not in html and external_references(html) == []
    assert _scoped(html) == [], _scoped(html)


def test_a_closed_session_says_so() -> None:
    import anychip
    from tests.models import transformer_layer

    sess = anychip.load(transformer_layer(), devices=["cpu"])
    assert "anychip-graph" in sess._repr_html_()
    sess.close()
    assert "(closed)" in sess._repr_html_()
